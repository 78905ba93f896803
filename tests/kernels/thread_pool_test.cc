// ThreadPool under concurrent callers: coverage (every index exactly once), progress of short
// calls next to a long one that occupies every worker, nesting. Also run under TSan.
#include "kvc/kernels/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvc::kernels {
namespace {

TEST(ThreadPoolTest, SizeCountsTheCaller) {
  EXPECT_EQ(ThreadPool(1).size(), 1);
  EXPECT_EQ(ThreadPool(3).size(), 3);
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(ThreadPool(0).size(), hw > 0 ? hw : 1);
}

TEST(ThreadPoolTest, EmptyAndInlineRanges) {
  ThreadPool pool(3);
  int calls = 0;
  pool.ParallelFor(0, 4, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
  pool.ParallelFor(5, 0, [&](int64_t b, int64_t e) { calls += static_cast<int>(e - b); });
  EXPECT_EQ(calls, 5);
}

// Several threads call ParallelFor at once with assorted sizes and grains; every index of
// every call is visited exactly once, and chunks respect the grain.
TEST(ThreadPoolTest, ConcurrentCallersCoverEveryIndexOnce) {
  ThreadPool pool(4);
  constexpr int kCallers = 6, kCallsEach = 40;
  std::atomic<int> bad_chunks{0};
  std::vector<std::thread> callers;
  callers.reserve(kCallers);
  std::vector<int> failures(kCallers, 0);
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int i = 0; i < kCallsEach; ++i) {
        const int64_t n = 1 + (c * 7919 + i * 104729) % 5000;
        const int64_t grain = 1 + (c + i) % 97;
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        for (auto& h : hits) h.store(0, std::memory_order_relaxed);
        pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
          if (e - b > grain || b >= e) bad_chunks.fetch_add(1);
          for (int64_t k = b; k < e; ++k) hits[k].fetch_add(1, std::memory_order_relaxed);
        });
        for (int64_t k = 0; k < n; ++k) failures[c] += hits[k].load() != 1;
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(failures[c], 0) << "caller " << c;
  EXPECT_EQ(bad_chunks.load(), 0);
}

// The regression this pool fixes: a long op (every worker and its caller blocked inside its
// chunks) must not stall another caller's short ops. The long chunks wait for a release that
// comes only after the short calls are done, or for a timeout: with a serializing pool the
// short calls would finish only after the timeout, after the long call.
TEST(ThreadPoolTest, ShortCallsCompleteWhileALongCallRuns) {
  ThreadPool pool(4);
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> long_chunks_started{0};
  std::atomic<bool> long_done{false};
  const auto deadline = std::chrono::seconds(30);

  std::thread long_caller([&] {
    pool.ParallelFor(2 * pool.size(), 1, [&](int64_t, int64_t) {
      long_chunks_started.fetch_add(1);
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, deadline, [&] { return release; });
    });
    long_done.store(true);
  });
  // Every worker and the long caller are inside a long chunk.
  const auto start = std::chrono::steady_clock::now();
  while (long_chunks_started.load() < pool.size() &&
         std::chrono::steady_clock::now() - start < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(long_chunks_started.load(), pool.size());

  int64_t total = 0;
  for (int i = 0; i < 200; ++i) {
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(1000, 10, [&](int64_t b, int64_t e) {
      int64_t s = 0;
      for (int64_t k = b; k < e; ++k) s += k;
      sum.fetch_add(s);
    });
    total += sum.load();
  }
  const bool long_still_running = !long_done.load();
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  long_caller.join();
  EXPECT_EQ(total, 200 * (999 * 1000 / 2));
  EXPECT_TRUE(long_still_running) << "the short calls waited for the long one";
  EXPECT_TRUE(long_done.load());
}

// Idle workers help every active job: while a long call keeps its caller and one worker busy
// (both of its chunks handed out), the idle worker runs chunks of another caller's job.
TEST(ThreadPoolTest, IdleWorkersHelpOtherCallers) {
  ThreadPool pool(3);
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> started{0};
  std::atomic<bool> long_done{false};
  std::thread long_caller([&] {
    pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
      started.fetch_add(1);
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::seconds(30), [&] { return release; });
    });
    long_done.store(true);
  });
  while (started.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::thread::id me = std::this_thread::get_id();
  std::atomic<int> on_workers{0};
  for (int attempt = 0; attempt < 50 && on_workers.load() == 0; ++attempt) {
    pool.ParallelFor(64, 1, [&](int64_t, int64_t) {
      if (std::this_thread::get_id() != me) on_workers.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    });
  }
  const bool long_still_running = !long_done.load();
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  long_caller.join();
  EXPECT_GT(on_workers.load(), 0);
  EXPECT_TRUE(long_still_running);
}

TEST(ThreadPoolTest, NestedCallsComplete) {
  ThreadPool pool(3);
  std::atomic<int64_t> count{0};
  pool.ParallelFor(8, 1, [&](int64_t, int64_t) {
    pool.ParallelFor(100, 7, [&](int64_t b, int64_t e) { count.fetch_add(e - b); });
  });
  EXPECT_EQ(count.load(), 800);
}

}  // namespace
}  // namespace kvc::kernels
