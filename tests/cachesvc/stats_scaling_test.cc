// Pool statistics and a metrics scrape read running totals, not the sequences, and a listing
// page visits only its own sequences: they cost the same with 100 and with 10,000 live
// sequences, they never wait for a sequence's lock
// (one held by a long Compress), and the totals agree with the sequences themselves.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "cachesvc/core/store/kv_store.h"
#include "cachesvc/metrics/metrics.h"
#include "gtest/gtest.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/pool_device.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<KvStore> MakeStore() {
  PoolOptions pool;
  pool.device = testing::TestPoolDevice();
  pool.geometry = {2, 2, 4, 64, 16, DType::kF16, {}};
  pool.capacity_bytes = int64_t{512} << 20;
  KvStoreOptions o;
  o.pools.push_back(pool);
  auto store = KvStore::Create(o);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

void AddSequences(KvStore& store, int n, int tokens) {
  for (int i = 0; i < n; ++i) {
    auto seq = store.CreateSequence({});
    ASSERT_TRUE(seq.ok()) << seq.status();
    for (int l = 0; l < 2; ++l) {
      const std::string k =
          ::kvc::testing::MakeKv(1, l, 0, tokens, 2, 64, DType::kF16, /*is_value=*/false);
      AppendParams a;
      a.sequence_id = seq->id;
      a.layer = l;
      a.num_tokens = tokens;
      a.keys = a.values = k;
      KVC_ASSERT_OK(store.Append(a).status());
    }
  }
}

// Best of `rounds` timings of `calls` calls of each of `a` and `b`, the rounds interleaved
// (a, b, a, b, ...): both see the same machine, so a noisy neighbour (CI runs two tests at a
// time on two cores) slows both rather than one. Best = the cost without the noise.
template <typename A, typename B>
std::pair<double, double> BestSecondsInterleaved(A&& a, B&& b, int rounds = 15, int calls = 50) {
  double best_a = 1e9;
  double best_b = 1e9;
  auto time = [calls](auto& f) {
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) f();
    return std::chrono::duration<double>(Clock::now() - t0).count() / calls;
  };
  for (int r = 0; r < rounds; ++r) {
    best_a = std::min(best_a, time(a));
    best_b = std::min(best_b, time(b));
  }
  return {best_a, best_b};
}

TEST(StatsScalingTest, StatsAndScrapeCostTheSameAt100And10000Sequences) {
  auto small = MakeStore();
  auto store = MakeStore();
  KVC_ASSERT_OK_AND_ASSIGN(auto small_metrics, Metrics::Create("", small.get()));
  KVC_ASSERT_OK_AND_ASSIGN(auto metrics, Metrics::Create("", store.get()));
  AddSequences(*small, 100, 3);
  AddSequences(*store, 10000, 3);
  const auto [stats_100, stats_10k] =
      BestSecondsInterleaved([&] { (void)small->stats().GetPoolStats(""); },
                             [&] { (void)store->stats().GetPoolStats(""); });
  const auto [scrape_100, scrape_10k] = BestSecondsInterleaved(
      [&] { (void)small_metrics->Serialize(); }, [&] { (void)metrics->Serialize(); });
  RecordProperty("stats_us_100", static_cast<int>(stats_100 * 1e6));
  RecordProperty("stats_us_10000", static_cast<int>(stats_10k * 1e6));
  RecordProperty("scrape_us_100", static_cast<int>(scrape_100 * 1e6));
  RecordProperty("scrape_us_10000", static_cast<int>(scrape_10k * 1e6));
  // A cost that grew with the sequences would be ~100x here; 3x leaves room for cache
  // effects of a 100x larger store without letting a per-sequence walk through.
  EXPECT_LT(stats_10k, 3 * stats_100 + 10e-6)
      << "GetPoolStats: " << stats_100 * 1e6 << " us at 100, " << stats_10k * 1e6
      << " us at 10,000 sequences";
  EXPECT_LT(scrape_10k, 3 * scrape_100 + 50e-6) << "scrape: " << scrape_100 * 1e6 << " us at 100, "
                                                << scrape_10k * 1e6 << " us at 10,000 sequences";
  KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot stats, store->stats().GetPoolStats(""));
  EXPECT_EQ(stats.sequences, 10000);
  EXPECT_EQ(stats.visible_tokens, 10000 * 3);
  EXPECT_EQ(stats.stored_token_heads, 10000 * 3 * 2 * 2);
}

// A page of ListSequences (100 sequences, the first or a later one, every pool or one tenant's
// in one pool) and a tenant's stats of one pool visit only what they report: at 10,000 live
// sequences they cost about what they cost at 100 (issue 43 item 4: a page was O(pool), 24.5
// ms at 10,000 against 0.6 ms at 100).
TEST(StatsScalingTest, AListingPageCostsTheSameAt100And10000Sequences) {
  auto small = MakeStore();
  auto store = MakeStore();
  AddSequences(*small, 100, 3);
  AddSequences(*store, 10000, 3);
  ListSequencesParams first;
  first.limit = 100;
  ListSequencesParams later = first;
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceList page_1, store->stats().ListSequences(first));
  ASSERT_EQ(page_1.total, 10000);
  later.page_token = page_1.next_page_token;  // a page from the middle of the big store
  for (int i = 0; i < 40; ++i) {
    KVC_ASSERT_OK_AND_ASSIGN(const SequenceList page, store->stats().ListSequences(later));
    later.page_token = page.next_page_token;
  }
  ASSERT_FALSE(later.page_token.empty());
  ListSequencesParams of_tenant = first;
  of_tenant.pool = "default";  // its only pool: the same sequences, walked by pool
  const auto [list_100, list_10k] =
      BestSecondsInterleaved([&] { (void)small->stats().ListSequences(first); },
                             [&] { (void)store->stats().ListSequences(later); }, 15, 5);
  const auto [tenant_100, tenant_10k] =
      BestSecondsInterleaved([&] { (void)small->stats().ListSequences(of_tenant); },
                             [&] { (void)store->stats().ListSequences(of_tenant); }, 15, 5);
  const auto [stats_100, stats_10k] =
      BestSecondsInterleaved([&] { (void)small->stats().TenantPoolStats("", "default"); },
                             [&] { (void)store->stats().TenantPoolStats("", "default"); });
  RecordProperty("list_page_us_100", static_cast<int>(list_100 * 1e6));
  RecordProperty("list_page_us_10000", static_cast<int>(list_10k * 1e6));
  // Issue 43's bound is 2x; 3x here as above, for a 100x larger store's cache misses.
  EXPECT_LT(list_10k, 3 * list_100 + 20e-6)
      << "a page: " << list_100 * 1e6 << " us at 100, " << list_10k * 1e6 << " us at 10,000";
  EXPECT_LT(tenant_10k, 3 * tenant_100 + 20e-6)
      << "a pool's page: " << tenant_100 * 1e6 << " us at 100, " << tenant_10k * 1e6 << " us";
  EXPECT_LT(stats_10k, 3 * stats_100 + 10e-6)
      << "a tenant's stats of a pool: " << stats_100 * 1e6 << " us at 100, " << stats_10k * 1e6
      << " us at 10,000";
  KVC_ASSERT_OK_AND_ASSIGN(const PoolStatsSnapshot mine,
                           store->stats().TenantPoolStats("", "default"));
  EXPECT_EQ(mine.sequences, 10000);
}

TEST(StatsScalingTest, StatsDoNotWaitForASequenceBusyCompressing) {
  auto store = MakeStore();
  auto seq = store->CreateSequence({});
  ASSERT_TRUE(seq.ok());
  // Long enough (~200 ms on this VM) that a stats call waiting for the Compress stands out
  // from the scheduler's noise on two loaded cores (a 48 ms Compress once let a 12 ms
  // preemption of the stats loop cross the bound).
  constexpr int kTokens = 65536;
  constexpr int kChunk = 16384;
  for (int l = 0; l < 2; ++l) {
    for (int at = 0; at < kTokens; at += kChunk) {
      const std::string k =
          ::kvc::testing::MakeKv(2, l, at, kChunk, 2, 64, DType::kF16, /*is_value=*/false);
      AppendParams a;
      a.sequence_id = seq->id;
      a.layer = l;
      a.start_position = at;
      a.num_tokens = kChunk;
      a.keys = a.values = k;
      KVC_ASSERT_OK(store->Append(a).status());
    }
  }
  std::atomic<bool> done{false};
  double compress_seconds = 0;
  std::thread compress([&] {
    CompressParams p;
    p.sequence_id = seq->id;
    p.spec.storage = StorageFormat::kNvfp4;  // converts every token: long enough to observe
    p.spec.storage_set = true;
    const auto t0 = Clock::now();
    EXPECT_TRUE(store->Compress(p).ok());
    compress_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    done = true;
  });
  double worst = 0;
  int calls = 0;
  while (!done) {
    const auto t0 = Clock::now();
    KVC_ASSERT_OK(store->stats().GetPoolStats("").status());
    worst = std::max(worst, std::chrono::duration<double>(Clock::now() - t0).count());
    ++calls;
  }
  compress.join();
  ASSERT_GT(calls, 10) << "the Compress ended too soon to tell";
  EXPECT_LT(worst, compress_seconds / 4) << "GetPoolStats waited " << worst * 1e3 << " ms during a "
                                         << compress_seconds * 1e3 << " ms Compress";
}

}  // namespace
}  // namespace kvc::cachesvc
