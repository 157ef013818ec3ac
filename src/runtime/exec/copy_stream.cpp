#include "src/runtime/exec/copy_stream.hpp"

#include <exception>
#include <stdexcept>
#include <string>

namespace stratagem::exec {

struct CopyTask {
  std::function<void()> work;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

namespace {
class TaskRequest final : public Request {
 public:
  TaskRequest(std::shared_ptr<CopyTask> task, std::string stream)
      : task_(std::move(task)), stream_(std::move(stream)) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(task_->mu);
    task_->cv.wait(lock, [this] { return task_->done; });
    if (!task_->error) return;
    try {
      std::rethrow_exception(task_->error);
    } catch (const std::exception& e) {
      throw std::runtime_error("the " + stream_ + " stream failed: " + e.what());
    }
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(task_->mu);
    return task_->done;
  }

 private:
  std::shared_ptr<CopyTask> task_;
  std::string stream_;
};
}  // namespace

CopyStream::CopyStream(const char* name) : name_(name), worker_([this] { loop(); }) {}

CopyStream::~CopyStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

RequestPtr CopyStream::submit(std::function<void()> work) {
  auto task = std::make_shared<CopyTask>();
  task->work = std::move(work);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(task);
  }
  cv_.notify_all();
  return std::make_unique<TaskRequest>(task, name_);
}

void CopyStream::loop() {
  for (;;) {
    std::shared_ptr<CopyTask> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and drained
      task = queue_.front();
      queue_.pop_front();
    }
    try {
      task->work();
    } catch (...) {
      task->error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(task->mu);
      task->done = true;
    }
    task->cv.notify_all();
  }
}

}  // namespace stratagem::exec
