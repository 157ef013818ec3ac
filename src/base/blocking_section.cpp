// The monitor thread of stratagem/blocking_section.hpp.
#include "stratagem/blocking_section.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

namespace stratagem {

namespace {
struct State {
  std::mutex mutex;
  double timeout_s = 0;
  std::string prefix;
  std::string what;  // empty: no section open
  std::string detail;
  double start_s = 0;
  SectionBound bound;  // timeout_s > 0: the open section is bounded on its own
  bool thread_started = false;
};
State& state() {
  static State* s = new State;  // never destroyed: the thread may outlive main's statics
  return *s;
}
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
void watch() {
  State& s = state();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.bound.timeout_s > 0) {
      if (now_s() - s.start_s <= s.bound.timeout_s) continue;
      // As below; _exit also skips libhdf5's exit handlers, which would print its own
      // diagnostics about the file it is stuck in.
      std::fprintf(stderr, "%s%s\n", s.prefix.c_str(), s.bound.message.c_str());
      std::fflush(stderr);
      ::_exit(s.bound.exit_code);
    }
    if (s.what.empty() || s.timeout_s <= 0) continue;
    const double waited = now_s() - s.start_s;
    if (waited <= s.timeout_s) continue;
    // The main thread is stuck inside MPI or HDF5: it cannot throw, and MPI_Abort is not
    // callable from this thread. Exiting without MPI_Finalize makes the launcher end the job.
    std::fprintf(stderr, "%s%s waited %d s (--comm-timeout-s): %s\n", s.prefix.c_str(),
                 s.what.c_str(), int(waited), s.detail.c_str());
    std::fflush(stderr);
    ::_exit(1);
  }
}
void start_thread(State& s) {  // s.mutex held
  if (s.thread_started) return;
  std::thread(watch).detach();
  s.thread_started = true;
}
}  // namespace

void set_blocking_timeout(double timeout_s, std::string message_prefix) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.timeout_s = timeout_s;
  s.prefix = std::move(message_prefix);
  if (timeout_s > 0) start_thread(s);
}

std::string not_arrived(MPI_Comm comm) {
  int me = 0, size = 1;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &size);
  return not_arrived(me, size);
}

std::string not_arrived(int me, int size) {
  std::string out = size == 2 ? "not arrived: rank " : "not arrived: one or more of ranks ";
  bool first = true;
  for (int r = 0; r < size; ++r)
    if (r != me) out += (first ? "" : ",") + std::to_string(r), first = false;
  return out + " (stopped or died)";
}

BlockingSection::BlockingSection(std::string what, std::string detail) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.timeout_s <= 0) return;
  active_ = true;
  previous_ = std::move(s.what);
  previous_detail_ = std::move(s.detail);
  previous_start_s_ = s.start_s;
  previous_bound_ = std::move(s.bound);
  s.what = std::move(what);
  s.detail = std::move(detail);
  s.start_s = now_s();
  s.bound = SectionBound{};
}

BlockingSection::BlockingSection(SectionBound bound) {
  if (bound.timeout_s <= 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  start_thread(s);
  active_ = true;
  previous_ = std::move(s.what);
  previous_detail_ = std::move(s.detail);
  previous_start_s_ = s.start_s;
  previous_bound_ = std::move(s.bound);
  s.what = "bounded section";
  s.detail.clear();
  s.start_s = now_s();
  s.bound = std::move(bound);
}

BlockingSection::~BlockingSection() {
  if (!active_) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.what = std::move(previous_);
  s.detail = std::move(previous_detail_);
  s.start_s = previous_start_s_;
  s.bound = std::move(previous_bound_);
}

}  // namespace stratagem
