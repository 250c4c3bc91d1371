// A small fixed thread pool for the CPU backend: parallel_for splits [0, n) into contiguous
// ranges, one per worker, and blocks until all are done. The calling thread takes a share too.
// Nested calls from inside a worker run serially (no deadlock, no oversubscription).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lilac {

class ThreadPool {
 public:
  // threads <= 0: one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // fn(begin, end) over contiguous pieces of [0, n); pieces are at least `grain` long.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 1);

  // The process-wide pool (size from LILAC_THREADS, else hardware concurrency).
  static ThreadPool& global();

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0;
  size_t job_parts_ = 0;
  size_t generation_ = 0;
  size_t pending_ = 0;
  bool stop_ = false;
  std::mutex call_mutex_;  // one parallel_for at a time from outside the pool
};

}  // namespace lilac
