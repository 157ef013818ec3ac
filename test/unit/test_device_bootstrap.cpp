// The CPU-side logic of the CUDA runtime, tested in every CI run: the caching allocator's
// accounting, the order communicators are created in (NCCL bootstraps over it), and the
// choice of a rank's local GPU.
#define BOOST_TEST_MODULE device_bootstrap
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <map>
#include <set>

#include "src/runtime/alloc/caching_pool.hpp"
#include "stratagem/cuda_device.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/parallel_state.hpp"
#include "stratagem/plan.hpp"

using namespace stratagem;

namespace {
// A raw allocator over malloc that records what is outstanding, so the pool's own figures can
// be checked against the truth.
struct FakeDevice {
  std::map<void*, size_t> live;
  size_t limit = size_t(1) << 40;
  size_t used = 0;
  alloc::CachingPool::RawAlloc alloc() {
    return [this](size_t n) -> void* {
      if (used + n > limit) return nullptr;
      void* p = std::malloc(n);
      live[p] = n;
      used += n;
      return p;
    };
  }
  alloc::CachingPool::RawFree free() {
    return [this](void* p) {
      used -= live.at(p);
      live.erase(p);
      std::free(p);
    };
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(pool_counts_bytes_per_category_and_reuses_blocks) {
  FakeDevice dev;
  {
    alloc::CachingPool pool(dev.alloc(), dev.free());
    BOOST_TEST(alloc::CachingPool::round_size(1) == 512u);
    BOOST_TEST(alloc::CachingPool::round_size(513) == 1024u);
    BOOST_TEST(alloc::CachingPool::round_size((1u << 20) + 1) == (2u << 20));

    void* w = pool.allocate(1000, MemCategory::weights);
    void* g = pool.allocate(3u << 20, MemCategory::grads);
    void* a = pool.allocate(100, MemCategory::activations);
    const auto& s = pool.stats();
    BOOST_TEST(s.requested_bytes[int(MemCategory::weights)] == 1000);
    BOOST_TEST(s.requested_bytes[int(MemCategory::grads)] == int64_t(3u << 20));
    BOOST_TEST(s.requested_bytes[int(MemCategory::activations)] == 100);
    BOOST_TEST(s.requested_total == 1000 + int64_t(3u << 20) + 100);
    BOOST_TEST(s.reserved_bytes == int64_t(dev.used));
    BOOST_TEST(s.reserved_bytes == 1024 + int64_t(4u << 20) + 512);
    BOOST_TEST(s.raw_allocs == 3);

    // A freed block serves the next request of its size class, without touching the device.
    pool.release(a);
    BOOST_TEST(s.requested_bytes[int(MemCategory::activations)] == 0);
    BOOST_TEST(s.cached_bytes == 512);
    void* b = pool.allocate(300, MemCategory::buffers);
    BOOST_TEST(b == a);
    BOOST_TEST(s.cache_hits == 1);
    BOOST_TEST(s.raw_allocs == 3);
    BOOST_TEST(s.cached_bytes == 0);
    BOOST_TEST(s.requested_bytes[int(MemCategory::buffers)] == 300);

    // A large block is reused for a request up to half its size, not smaller.
    pool.release(g);                                            // 4 MiB cached
    void* small = pool.allocate(1u << 20, MemCategory::grads);  // rounds to 2 MiB: fits 4 MiB
    BOOST_TEST(small == g);
    pool.release(small);
    void* tiny = pool.allocate(600, MemCategory::grads);  // small class: a fresh block
    BOOST_TEST(tiny != g);

    // High-water marks survive releases.
    BOOST_TEST(s.requested_total_high_water >= 1000 + int64_t(3u << 20) + 100);
    BOOST_TEST(s.reserved_high_water >= s.reserved_bytes);

    // Out of device memory: the cache is given back and the request retried.
    pool.release(w);
    pool.release(b);
    pool.release(tiny);
    // Room for 3 MiB: the 6 MiB block fits only once the cached 4 MiB block is given back.
    dev.limit = dev.used + (3u << 20);
    void* big = pool.allocate(5u << 20, MemCategory::weights);
    BOOST_TEST(big != nullptr);
    BOOST_TEST(s.cached_bytes == 0);
    BOOST_TEST(s.reserved_bytes == int64_t(dev.used));
    dev.limit = dev.used;
    BOOST_CHECK_THROW(pool.allocate(64u << 20, MemCategory::weights), std::bad_alloc);
    BOOST_CHECK_THROW(pool.release(reinterpret_cast<void*>(0x10)), std::logic_error);
    pool.release(big);
  }
  BOOST_TEST(dev.live.empty());  // the pool returned every block when it was destroyed
}

BOOST_AUTO_TEST_CASE(communicators_are_created_once_per_member_list_in_layout_order) {
  ModelSpec model = load_model("gpt2-124m");
  ClusterSpec cluster = load_cluster("dgx-a100-80g");
  cluster.nodes = 2;
  PlanShorthand s;
  s.tp = 2, s.pp = 2, s.micro_batch = 1, s.global_batch = 16;
  Plan plan = expand_shorthand(s, model, cluster);
  Layout layout(plan, cluster);
  const int world = layout.world_size();
  BOOST_TEST(world == 16);
  std::vector<std::vector<CommToCreate>> per_rank;
  for (int r = 0; r < world; ++r) per_rank.push_back(communicator_order(layout, r));
  const auto& order = per_rank[0];
  // Every rank walks the same member lists in the same order (collective creation matches).
  for (int r = 1; r < world; ++r) {
    BOOST_REQUIRE_EQUAL(per_rank[r].size(), order.size());
    for (size_t i = 0; i < order.size(); ++i) BOOST_TEST(per_rank[r][i].ranks == order[i].ranks);
  }
  // Distinct member lists, each covering every Layout group with those members, in the order
  // their first group appears.
  std::set<std::vector<int>> seen;
  std::map<int, size_t> entry_of_group;
  for (size_t i = 0; i < order.size(); ++i) {
    BOOST_TEST(seen.insert(order[i].ranks).second);
    for (int id : order[i].group_ids) entry_of_group[id] = i;
  }
  size_t last_first = 0;
  for (const Group& g : layout.groups()) {
    BOOST_REQUIRE(entry_of_group.count(g.id));
    BOOST_TEST(order[entry_of_group[g.id]].ranks == g.ranks);
    if (order[entry_of_group[g.id]].group_ids.front() == g.id) {
      BOOST_TEST(entry_of_group[g.id] >= last_first);
      last_first = entry_of_group[g.id];
    }
  }
  // A rank's position is its index among the members, -1 when it is not one.
  for (int r = 0; r < world; ++r)
    for (const CommToCreate& c : per_rank[r]) {
      const auto it = std::find(c.ranks.begin(), c.ranks.end(), r);
      BOOST_TEST(c.position == (it == c.ranks.end() ? -1 : int(it - c.ranks.begin())));
    }
}

BOOST_AUTO_TEST_CASE(local_device_choice) {
  // NCCL: one GPU per rank.
  BOOST_TEST(choose_local_device(3, 8, 8, true) == 3);
  BOOST_CHECK_THROW(choose_local_device(0, 4, 1, true), std::invalid_argument);
  try {
    choose_local_device(0, 4, 2, true);
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("--comm mpi") != std::string::npos);
  }
  // Staged MPI: ranks share GPUs round-robin.
  BOOST_TEST(choose_local_device(0, 4, 1, false) == 0);
  BOOST_TEST(choose_local_device(3, 4, 1, false) == 0);
  BOOST_TEST(choose_local_device(3, 4, 2, false) == 1);
  BOOST_CHECK_THROW(choose_local_device(0, 1, 0, false), std::invalid_argument);
  BOOST_CHECK_THROW(choose_local_device(2, 2, 1, false), std::invalid_argument);
}
