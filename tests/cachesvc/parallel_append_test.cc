// Appends of different layers of one sequence write their rows with the sequence's lock
// released (two-phase Append, cachesvc/core/ops/append.h): one writer thread per layer, with
// readers, forks, compression and a Release of the same sequence running meanwhile. What a
// user relies on: every layer ends exactly as appended; every Fetch (and every fork) shows,
// per layer, a prefix of what was appended, each position once with its own data; a
// Release during the writes leaves the pool with no block of the sequence; nothing is lost
// or half-written.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cachesvc/core/store/kv_store.h"
#include "gtest/gtest.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/pool_device.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::KvValue;
using ::kvc::testing::MakeKv;

constexpr int kLayers = 6, kHeads = 2, kDim = 32, kBlock = 16;
constexpr uint32_t kSeed = 11;

struct Case {
  const char* name;
  StorageFormat storage;
  int residual;
  float tolerance;  // of a stored element against the appended f16 value
  // An automatic StreamingLLM policy (4 sinks + 48 recent): appends evict and compact in
  // place, which must not run with the lock released.
  bool evicts = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// An element as appended: f16.
float AsAppended(float x) { return kernels::HalfToFloat(kernels::FloatToHalf(x)); }

class ParallelAppendTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    PoolOptions pool;
    pool.device = testing::TestPoolDevice();
    pool.geometry = {kLayers, kHeads, kHeads, kDim, kBlock, DType::kF16, {}};
    pool.capacity_bytes = int64_t{128} << 20;
    KvStoreOptions options;
    options.pools.push_back(pool);
    KVC_ASSERT_OK_AND_ASSIGN(store_, KvStore::Create(options));
  }

  std::string Create() {
    CreateSequenceParams create;
    create.policy.storage = GetParam().storage;
    create.policy.storage_set = true;
    create.policy.residual_tokens = GetParam().residual;
    if (GetParam().evicts) {
      create.policy.eviction = CompressionSpec::Eviction::kStreamingLlm;
      create.policy.sinks = 4;
      create.policy.window = 48;
    }
    absl::StatusOr<SequenceSnapshot> seq = store_->CreateSequence(create);
    EXPECT_TRUE(seq.ok()) << seq.status();
    return seq.ok() ? seq->id : "";
  }

  absl::Status Append(const std::string& id, int layer, int64_t start, int n) {
    AppendParams a;
    a.sequence_id = id;
    a.layer = layer;
    a.start_position = start;
    a.num_tokens = n;
    const std::string k =
        MakeKv(kSeed, layer, start, n, kHeads, kDim, DType::kF16, /*is_value=*/false);
    const std::string v =
        MakeKv(kSeed, layer, start, n, kHeads, kDim, DType::kF16, /*is_value=*/true);
    a.keys = k;
    a.values = v;
    return store_->Append(a).status();
  }

  // Fetches every appended token of every layer and checks it: per lane the positions
  // 0..n-1 once each with their own data (with eviction: no position twice), both heads of
  // a layer the same n. Returns each layer's n (the highest position + 1 with eviction;
  // 0 for a layer not asked for with `only_layer`; empty when the Fetch failed: `status`
  // says why), or a problem in `problem`.
  std::vector<int64_t> FetchChecked(const std::string& id, absl::Status* status,
                                    std::string* problem, int only_layer = -1) {
    FetchParams f;
    f.sequence_id = id;
    f.include_unfinished = true;
    f.max_chunk_bytes = 16384;
    if (only_layer >= 0) f.layers = {only_layer};
    f.dtype = DType::kF32;
    std::map<std::pair<int, int>, std::vector<int>> seen;
    *status = store_->Fetch(f, [&](FetchChunk& c) {
      std::vector<int>& lane = seen[{c.layer, c.kv_head}];
      const auto* keys = reinterpret_cast<const float*>(c.keys.data());
      const auto* values = reinterpret_cast<const float*>(c.values.data());
      for (int t = 0; t < c.num_tokens && problem->empty(); ++t) {
        const int32_t pos = c.positions[static_cast<size_t>(t)];
        if (pos < 0) *problem = "a negative position";
        if (static_cast<size_t>(pos) >= lane.size()) lane.resize(static_cast<size_t>(pos) + 1, 0);
        ++lane[static_cast<size_t>(pos)];
        for (int e = 0; e < kDim; ++e) {
          const float want_k =
              AsAppended(KvValue(kSeed, c.layer, c.kv_head, pos, e, /*is_value=*/false));
          const float want_v =
              AsAppended(KvValue(kSeed, c.layer, c.kv_head, pos, e, /*is_value=*/true));
          const size_t at = static_cast<size_t>(t) * kDim + static_cast<size_t>(e);
          if (std::fabs(keys[at] - want_k) > GetParam().tolerance ||
              std::fabs(values[at] - want_v) > GetParam().tolerance) {
            *problem = "layer " + std::to_string(c.layer) + " head " + std::to_string(c.kv_head) +
                       " position " + std::to_string(pos) + " carries other data";
            break;
          }
        }
      }
      return problem->empty();
    });
    std::vector<int64_t> counts(kLayers, 0);
    if (!status->ok() || !problem->empty()) return {};
    for (int layer = 0; layer < kLayers; ++layer) {
      if (only_layer >= 0 && layer != only_layer) continue;
      for (int h = 0; h < kHeads; ++h) {
        const std::vector<int>& lane = seen[{layer, h}];
        const int most = GetParam().evicts ? 1 : 0;  // with eviction: skipped ones allowed
        if (std::any_of(lane.begin(), lane.end(), [&](int n) { return n > 1 || n < 1 - most; })) {
          *problem = "layer " + std::to_string(layer) + " head " + std::to_string(h) +
                     " served a position twice or skipped one";
          return {};
        }
        if (h > 0 && static_cast<int64_t>(lane.size()) != counts[static_cast<size_t>(layer)] &&
            !GetParam().evicts) {
          *problem = "the heads of layer " + std::to_string(layer) + " disagree on its length";
          return {};
        }
        counts[static_cast<size_t>(layer)] = static_cast<int64_t>(lane.size());
      }
    }
    return counts;
  }

  int64_t UsedBlocks() {
    absl::StatusOr<PoolStatsSnapshot> stats = store_->stats().GetPoolStats("");
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? stats->used_blocks : -1;
  }

  std::unique_ptr<KvStore> store_;
};

// Every layer appended by its own thread in chunks of 1..40 tokens, while a reader fetches
// the sequence and another thread forks it, checks the fork and releases it.
TEST_P(ParallelAppendTest, LayersWrittenInParallelStayExactAndReadersSeeAppendedPrefixes) {
  const std::string id = Create();
  constexpr int64_t kTokens = 4000;
  std::atomic<int> writing{kLayers};
  std::vector<std::thread> writers;
  writers.reserve(kLayers);
  for (int layer = 0; layer < kLayers; ++layer) {
    writers.emplace_back([&, layer] {
      std::mt19937 rng(static_cast<uint32_t>(layer));
      for (int64_t pos = 0; pos < kTokens;) {
        const int n = static_cast<int>(std::min<int64_t>(1 + rng() % 40, kTokens - pos));
        const absl::Status st = Append(id, layer, pos, n);
        if (!st.ok()) {
          ADD_FAILURE() << "layer " << layer << " at " << pos << ": " << st;
          break;
        }
        pos += n;
        // As a prefill's layers arrive: often back to back, now and then with a pause that
        // lets a whole Fetch or fork in.
        if (rng() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
      }
      --writing;
    });
  }
  int fetches = 0, forks = 0;
  std::string problem, fork_problem;  // the main thread's, the forker's
  std::atomic<bool> fork_failed{false};
  std::thread forker([&] {
    while (writing > 0) {
      ForkSequenceParams fork;
      fork.sequence_id = id;
      absl::StatusOr<SequenceSnapshot> child = store_->ForkSequence(fork);
      ASSERT_TRUE(child.ok()) << child.status();
      absl::Status st;
      const std::vector<int64_t> counts = FetchChecked(child->id, &st, &fork_problem);
      if (!fork_problem.empty()) {
        fork_failed = true;
        return;
      }
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(counts, child->layer_tokens) << "the fork serves other lengths than it has";
      KVC_ASSERT_OK(store_->Release(child->id).status());
      ++forks;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::vector<int64_t> last(kLayers, 0);
  // One layer per Fetch: a whole-sequence Fetch would end ABORTED whenever any layer's
  // residual ages meanwhile, which with six writers (under a sanitizer) is every time.
  for (int round = 0; writing > 0 && problem.empty() && !fork_failed; ++round) {
    absl::Status st;
    const int layer = round % kLayers;
    const std::vector<int64_t> counts = FetchChecked(id, &st, &problem, layer);
    if (!problem.empty()) break;                            // (the check stopped the Fetch)
    if (st.code() == absl::StatusCode::kAborted) continue;  // a residual aged mid-Fetch
    if (!st.ok()) {
      ADD_FAILURE() << st;
      break;
    }
    EXPECT_GE(counts[static_cast<size_t>(layer)], last[static_cast<size_t>(layer)])
        << "layer " << layer << " went back";
    last[static_cast<size_t>(layer)] = counts[static_cast<size_t>(layer)];
    ++fetches;
  }
  for (std::thread& t : writers) t.join();
  forker.join();
  EXPECT_TRUE(problem.empty()) << problem;
  EXPECT_TRUE(fork_problem.empty()) << "a fork: " << fork_problem;

  absl::Status st;
  EXPECT_EQ(FetchChecked(id, &st, &problem), std::vector<int64_t>(kLayers, kTokens)) << problem;
  KVC_EXPECT_OK(st);
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot info, store_->GetSequence(id));
  EXPECT_EQ(info.visible_tokens, kTokens);
  EXPECT_EQ(info.layer_tokens, std::vector<int64_t>(kLayers, kTokens));
  if (GetParam().evicts) {  // 4 sinks + at most 48 recent + one block of slack per lane
    for (int64_t n : info.stored_tokens) EXPECT_LE(n, 4 + 48 + kBlock);
  }
  KVC_EXPECT_OK(store_->Release(id).status());
  EXPECT_EQ(UsedBlocks(), 0);
  EXPECT_GT(fetches, 0) << "no Fetch overlapped the writes";
  EXPECT_GT(forks, 0) << "no fork overlapped the writes";
}

// A Release (and, before it, a Compress) lands while every layer is being written: the
// appends before it are exact, every one after it is NOT_FOUND, and no block stays held.
TEST_P(ParallelAppendTest, ReleaseDuringParallelWritesLeavesNoBlockBehind) {
  for (int round = 0; round < 8; ++round) {
    const std::string id = Create();
    std::atomic<int> appended{0};
    std::atomic<bool> released{false};
    std::vector<std::thread> writers;
    writers.reserve(kLayers);
    for (int layer = 0; layer < kLayers; ++layer) {
      writers.emplace_back([&, layer] {
        for (int64_t pos = 0;; pos += 24) {
          const bool after = released;
          const absl::Status st = Append(id, layer, pos, 24);
          if (st.ok()) {
            ASSERT_FALSE(after) << "an append after the Release succeeded";
            ++appended;
            continue;
          }
          ASSERT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
          return;
        }
      });
    }
    while (appended < kLayers * (2 + round)) std::this_thread::yield();
    CompressParams compress;
    compress.sequence_id = id;
    compress.spec.eviction = CompressionSpec::Eviction::kStreamingLlm;
    compress.spec.sinks = 4;
    compress.spec.window = 40;
    KVC_EXPECT_OK(store_->Compress(compress).status());
    std::this_thread::sleep_for(std::chrono::microseconds(200 * round));
    KVC_EXPECT_OK(store_->Release(id).status());
    released = true;
    for (std::thread& t : writers) t.join();
    EXPECT_EQ(UsedBlocks(), 0) << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Storage, ParallelAppendTest,
    ::testing::Values(Case{"F16", StorageFormat::kF16, 0, 0.0f},
                      Case{"Int8Residual16", StorageFormat::kInt8, 16, 0.07f},
                      Case{"F16StreamingLlm", StorageFormat::kF16, 0, 0.0f, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvc::cachesvc
