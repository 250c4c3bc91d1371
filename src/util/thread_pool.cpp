#include "util/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace lilac {

namespace {
thread_local bool in_pool_worker = false;
}

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

static void run_part(const std::function<void(size_t, size_t)>& fn, size_t n, size_t parts,
                     size_t part) {
  size_t begin = n * part / parts, end = n * (part + 1) / parts;
  if (begin < end) fn(begin, end);
}

void ThreadPool::worker_loop(int index) {
  in_pool_worker = true;
  size_t seen = 0;
  for (;;) {
    const std::function<void(size_t, size_t)>* job;
    size_t n, parts;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      parts = job_parts_;
    }
    if (size_t(index) < parts) run_part(*job, n, parts, size_t(index));
    {
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn,
                              size_t grain) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  size_t parts = std::min<size_t>(size_t(size()), (n + grain - 1) / grain);
  if (parts <= 1 || workers_.empty() || in_pool_worker) {
    fn(0, n);
    return;
  }
  std::lock_guard call_lock(call_mutex_);
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_parts_ = parts;
    pending_ = workers_.size();
    ++generation_;
  }
  wake_.notify_all();
  bool was_worker = in_pool_worker;
  in_pool_worker = true;  // nested parallel_for from the caller's share runs serially
  run_part(fn, n, parts, 0);
  in_pool_worker = was_worker;
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    const char* env = std::getenv("LILAC_THREADS");
    return env ? std::atoi(env) : 0;
  }());
  return pool;
}

}  // namespace lilac
