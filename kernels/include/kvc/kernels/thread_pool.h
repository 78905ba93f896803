// A fixed pool of threads with a blocking ParallelFor that any number of threads may call at
// once (the CPU kernel backend's pool; the reference worker can share it). Plain C++17.
//
// Concurrency model: every ParallelFor call is a job (a range cut into chunks of `grain`
// items) in a list of active jobs. The calling thread always works through its own job's
// chunks itself, so a call makes progress even when every worker is busy with somebody
// else's long job; idle workers help the active jobs one chunk at a time, each time taking
// the job with the fewest chunks left (ties in turn), so a short call next to a long one gets
// the workers as soon as they finish a chunk. There is no call-wide lock: a long op no longer
// stalls other callers' short ops. A caller never runs another job's chunks, so a ParallelFor may
// be nested inside fn (the inner call runs on its caller's thread plus whichever workers are idle).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvc::kernels {

class ThreadPool {
 public:
  // Threads that run chunks, the caller included: num_threads - 1 workers are started.
  // num_threads <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  // Every ParallelFor call must have returned.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Workers plus one (the calling thread).
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n), each of at most `grain` items
  // (grain < 1 counts as 1), and returns when all of them have returned. Chunks run
  // concurrently on the caller and on idle workers, in no particular order; fn must not
  // throw. Thread-safe.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Job;

  void WorkerLoop();
  Job* PickJob();         // requires mu_ and a non-empty active_
  void Unlist(Job* job);  // requires mu_

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;    // workers: a job was listed, or stop_
  std::vector<Job*> active_;        // guarded by mu_: jobs that may still have chunks to hand out
  size_t next_job_ = 0;             // guarded by mu_: where PickJob starts (breaks ties)
  std::atomic<int> num_active_{0};  // active_.size(), read without mu_ as a hint
  bool stop_ = false;               // guarded by mu_
};

}  // namespace kvc::kernels
