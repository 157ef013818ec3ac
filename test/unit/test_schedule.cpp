// ScheduleShape, the one description of a pipeline schedule the Program, the estimator and the
// search share: its counts agree with the pass order stage_schedule() walks, and that order is
// the published one.
#define BOOST_TEST_MODULE schedule
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <string>

#include "stratagem/schedule.hpp"

using namespace stratagem;

namespace {

std::vector<ScheduleShape> shapes() {
  std::vector<ScheduleShape> out;
  for (int pp : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 7, 8, 16}) {
      out.push_back({pp, 1, Schedule::gpipe, m});
      out.push_back({pp, 1, Schedule::one_f_one_b, m});
      // Megatron-Core's interleaved schedule: groups of at least pp micro-batches per chunk,
      // the last group none or at least pp (interleaved_group's choice, and every other group
      // it accepts).
      if (pp > 1 && m >= pp)
        for (int v : {2, 3}) {
          out.push_back({pp, v, Schedule::interleaved, m, interleaved_group(pp, m)});
          for (int g = pp; g <= m; ++g)
            if (m % g == 0 || m % g >= pp) out.push_back({pp, v, Schedule::interleaved, m, g});
        }
    }
  return out;
}

std::string order(const ScheduleShape& shape, int stage) {
  std::string s;
  for (const PassStep& p : stage_schedule(shape, stage))
    s += (p.forward ? "F" : "B") + std::to_string(p.chunk) + "." + std::to_string(p.microbatch) +
         " ";
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(counts_agree_with_the_pass_order) {
  for (const ScheduleShape& shape : shapes())
    for (int s = 0; s < shape.pp; ++s) {
      BOOST_TEST_INFO("pp " << shape.pp << " v " << shape.vpp << " m " << shape.microbatches
                            << " schedule " << int(shape.schedule) << " stage " << s);
      const auto steps = stage_schedule(shape, s);
      BOOST_TEST(int(steps.size()) == 2 * shape.chunk_passes());
      int leading = 0;
      while (leading < int(steps.size()) && steps[size_t(leading)].forward) ++leading;
      // The warm-up's forwards and the first steady one come before any backward.
      BOOST_TEST(leading == std::min(shape.warmup_forwards(s) + 1, shape.chunk_passes()));
      // Passes alive at once: forwards run minus backwards run, at its largest.
      int alive = 0, most = 0, forwards = 0;
      std::vector<int> on_chunk(size_t(shape.vpp), 0);
      for (const PassStep& p : steps) {
        alive += p.forward ? 1 : -1;
        most = std::max(most, alive);
        BOOST_TEST(p.chunk % shape.pp == s);
        if (!p.forward) continue;
        ++forwards;
        ++on_chunk[size_t(p.chunk / shape.pp)];
        for (int c = 0; c < shape.vpp; ++c)
          BOOST_TEST(shape.forwards_on_chunk(forwards, c) == on_chunk[size_t(c)]);
      }
      BOOST_TEST(most == shape.passes_in_flight(s));
      BOOST_TEST(alive == 0);
    }
}

BOOST_AUTO_TEST_CASE(every_pass_runs_once_and_backward_after_forward) {
  for (const ScheduleShape& shape : shapes())
    for (int s = 0; s < shape.pp; ++s) {
      std::vector<int> state(size_t(shape.vpp * shape.microbatches), 0);
      for (const PassStep& p : stage_schedule(shape, s)) {
        int& x = state[size_t(p.chunk / shape.pp * shape.microbatches + p.microbatch)];
        BOOST_TEST(x == (p.forward ? 0 : 1));
        x += 1;
      }
      for (int x : state) BOOST_TEST(x == 2);
    }
}

BOOST_AUTO_TEST_CASE(interleaved_group_is_the_smallest_megatron_accepts) {
  BOOST_TEST(interleaved_group(4, 8) == 4);      // a multiple of pp: pp
  BOOST_TEST(interleaved_group(2, 5) == 3);      // schedules.py's own example, PP2 N3 M5
  BOOST_TEST(interleaved_group(16, 120) == 20);  // 16..19 leave 8, 1, 12, 6: fewer than pp
  BOOST_TEST(interleaved_group(4, 6) == 6);      // 4 and 5 leave 2 and 1: one group of all
  for (int pp = 2; pp <= 8; ++pp)
    for (int m = pp; m <= 40; ++m) {
      const int g = interleaved_group(pp, m);
      BOOST_TEST((g >= pp && g <= m && (m % g == 0 || m % g >= pp)));
      for (int h = pp; h < g; ++h) BOOST_TEST((m % h != 0 && m % h < pp));
    }
}

BOOST_AUTO_TEST_CASE(published_orders) {
  // Megatron-Core's interleaved schedule in groups (model_parallel_config.py's docstring of
  // microbatch_group_size_per_vp_stage): PP 2, VP 2, groups of 3, 5 micro-batches; rank 0 runs
  // forwards of micro-batches 0 1 2 0 1 2 3 4 3 4 on chunks 0 0 0 1 1 1 0 0 1 1.
  {
    std::string forwards;
    for (const PassStep& p : stage_schedule({2, 2, Schedule::interleaved, 5, 3}, 0))
      if (p.forward)
        forwards += std::to_string(p.microbatch) + "." + std::to_string(p.chunk / 2) + " ";
    BOOST_TEST(forwards == "0.0 1.0 2.0 0.1 1.1 2.1 3.0 4.0 3.1 4.1 ");
  }
  // Groups of 2, 4 micro-batches (the same docstring): 0 1 0 1 2 3 2 3.
  {
    std::string forwards;
    for (const PassStep& p : stage_schedule({2, 2, Schedule::interleaved, 4, 2}, 0))
      if (p.forward) forwards += std::to_string(p.microbatch) + " ";
    BOOST_TEST(forwards == "0 1 0 1 2 3 2 3 ");
  }
  // GPipe: every forward, then the backwards, latest micro-batch first.
  BOOST_TEST(order({2, 1, Schedule::gpipe, 3}, 1) == "F1.0 F1.1 F1.2 B1.2 B1.1 B1.0 ");
  // 1F1B, stage 0 of 3 with 4 micro-batches: 2 warm-up forwards, then alternate.
  BOOST_TEST(order({3, 1, Schedule::one_f_one_b, 4}, 0) ==
             "F0.0 F0.1 F0.2 B0.0 F0.3 B0.1 B0.2 B0.3 ");
  // Interleaved (Narayanan et al. 2021), pp 2, v 2, 4 micro-batches, stage 1: warm-up
  // 2 (pp - s - 1) + (v - 1) pp = 2 forwards (micro-batches 0, 1 on chunk 1), then chunk 3's
  // forwards alternate with its backwards; backward walks the chunks in reverse.
  BOOST_TEST(order({2, 2, Schedule::interleaved, 4}, 1) ==
             "F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3 ");
}
