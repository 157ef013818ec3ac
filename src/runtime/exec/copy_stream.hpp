// A copy stream of the Program (h2d or d2h) on the CPU backend: one worker thread that runs
// the stream's work in issue order, as a CUDA stream would, so that offload copies and the
// host optimizer overlap the compute that the rank thread goes on with. Each submission
// returns a Request (comm.hpp) that the executor waits for like a transfer.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "stratagem/comm.hpp"

namespace stratagem::exec {

struct CopyTask;

class CopyStream {
 public:
  explicit CopyStream(const char* name);
  ~CopyStream();  // drains the queue, then joins the worker
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // Runs `work` after everything submitted before it. An exception thrown by `work` is
  // rethrown by the request's wait(), naming the stream.
  RequestPtr submit(std::function<void()> work);

 private:
  void loop();

  const char* name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<CopyTask>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace stratagem::exec
