#include "kvc/kernels/thread_pool.h"

#include <algorithm>

namespace kvc::kernels {

// One ParallelFor call. Lives on its caller's stack: the caller unlists it and waits until no
// worker is inside it before returning.
struct ThreadPool::Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int64_t grain = 1;
  std::atomic<int64_t> next{0};  // first item of the next chunk to hand out
  int helpers = 0;               // guarded by mu_: workers running this job's chunks
  bool listed = false;           // guarded by mu_: in active_
  std::condition_variable done;  // helpers reached 0 once the job was unlisted
};

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Unlist(Job* job) {
  if (!job->listed) return;
  job->listed = false;
  active_.erase(std::find(active_.begin(), active_.end(), job));
  num_active_.store(static_cast<int>(active_.size()), std::memory_order_relaxed);
}

// The job with the fewest chunks left (ties: round robin). A short op that arrives while a
// long one runs (one decode step's attention beside a Compress) is helped first, so its
// latency stays near what it would be alone, and the long op loses only a short op's worth.
ThreadPool::Job* ThreadPool::PickJob() {
  const size_t k = active_.size();
  const size_t start = next_job_++ % k;
  Job* best = nullptr;
  int64_t best_left = 0;
  for (size_t i = 0; i < k; ++i) {
    Job* job = active_[(start + i) % k];
    const int64_t left = (job->n - job->next.load(std::memory_order_relaxed)) / job->grain;
    if (best == nullptr || left < best_left) {
      best = job;
      best_left = left;
    }
  }
  return best;
}

void ThreadPool::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !active_.empty(); });
    if (stop_) return;
    Job* job = PickJob();
    ++job->helpers;
    lock.unlock();
    // Alone with this job, keep taking its chunks without the lock (one caller: the same
    // cost as a single-job pool); with other jobs active, go back to the round-robin after
    // each chunk so that every job gets help.
    bool exhausted = false;
    for (;;) {
      const int64_t begin = job->next.fetch_add(job->grain, std::memory_order_relaxed);
      if (begin >= job->n) {
        exhausted = true;
        break;
      }
      (*job->fn)(begin, std::min(job->n, begin + job->grain));
      if (num_active_.load(std::memory_order_relaxed) > 1) break;
    }
    lock.lock();
    if (exhausted) Unlist(job);  // nothing left to hand out: stop offering it
    if (--job->helpers == 0 && !job->listed) job->done.notify_all();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  Job job;
  job.fn = &fn;
  job.n = n;
  job.grain = grain;
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_.push_back(&job);
    job.listed = true;
    num_active_.store(static_cast<int>(active_.size()), std::memory_order_relaxed);
  }
  // Wake at most one worker per chunk the caller will not take itself; busy workers look at
  // the list again after their current chunk.
  const int64_t chunks = (n - 1) / grain + 1;
  const int64_t wanted = std::min<int64_t>(static_cast<int64_t>(workers_.size()), chunks - 1);
  if (wanted == static_cast<int64_t>(workers_.size())) {
    wake_.notify_all();
  } else {
    for (int64_t i = 0; i < wanted; ++i) wake_.notify_one();
  }
  for (;;) {
    const int64_t begin = job.next.fetch_add(grain, std::memory_order_relaxed);
    if (begin >= n) break;
    fn(begin, std::min(n, begin + grain));
  }
  // Every chunk is handed out; wait for the workers still running one (their writes are
  // visible after this: they release mu_ after their chunk).
  std::unique_lock<std::mutex> lock(mu_);
  Unlist(&job);
  job.done.wait(lock, [&] { return job.helpers == 0; });
}

}  // namespace kvc::kernels
