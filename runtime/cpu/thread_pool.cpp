// The CPU backend's thread pool.
#include "runtime/cpu/thread_pool.h"

#include <algorithm>

namespace tpc::cpu {
namespace {
thread_local bool tInsideJob = false;
}

ThreadPool::ThreadPool(int threads) {
  threads_ = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallelFor(int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  int64_t chunks = std::min<int64_t>(threads_, (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1));
  if (chunks <= 1 || tInsideJob) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    n_ = n;
    chunks_ = chunks;
    pending_ = chunks - 1;
    ++generation_;
  }
  wake_.notify_all();
  tInsideJob = true;
  fn(0, n / chunks);
  tInsideJob = false;
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker(int id) {
  uint64_t seen = 0;
  tInsideJob = true;
  for (;;) {
    const Fn* job;
    int64_t n, chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = n_;
      chunks = chunks_;
    }
    if (id >= chunks) continue;
    (*job)(n * id / chunks, n * (id + 1) / chunks);
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace tpc::cpu
