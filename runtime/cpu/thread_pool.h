// A small persistent thread pool for the CPU backend: parallelFor splits a range into one contiguous
// chunk per thread; the calling thread runs the first chunk. Nested calls run serially.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tpc::cpu {

class ThreadPool {
 public:
  using Fn = std::function<void(int64_t begin, int64_t end)>;

  explicit ThreadPool(int threads);  // 0: std::thread::hardware_concurrency()
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }
  // Runs fn over [0, n) in at most size() chunks of at least `grain` items (serially if one chunk).
  void parallelFor(int64_t n, int64_t grain, const Fn& fn);

 private:
  void worker(int id);

  int threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const Fn* job_ = nullptr;
  int64_t n_ = 0, chunks_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace tpc::cpu
