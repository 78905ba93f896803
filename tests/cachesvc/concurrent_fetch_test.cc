// A Fetch that runs while the same sequence is appended to must return one state the
// sequence passed through (every visible position of every lane exactly once, each with its
// own data) or end ABORTED, never a mix. The case that once failed: INT8 storage with a raw
// residual, one token appended at a time, so a token ages out of the residual (and the
// residual is compacted) on every append while the Fetch streams.
#include <atomic>
#include <chrono>
#include <cmath>
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

constexpr int kLayers = 2, kHeads = 2, kDim = 32, kBlock = 16;
constexpr uint32_t kSeed = 7;

struct Case {
  const char* name;
  StorageFormat storage;
  int residual;
};

// Names the case in test output instead of dumping its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ConcurrentFetchTest : public ::testing::TestWithParam<Case> {};

// Checks one Fetch's chunks: every position in [0, visible) once per lane, with its data.
// Returns a description of the first problem, or "" when the state is one that existed.
std::string CheckSnapshot(const std::vector<FetchChunk>& chunks) {
  if (chunks.empty()) return "";
  const int64_t visible = chunks.front().visible_tokens;
  std::vector<std::vector<int>> seen(kLayers * kHeads, std::vector<int>(visible, 0));
  for (const FetchChunk& c : chunks) {
    if (c.visible_tokens != visible) return "chunks disagree on visible_tokens";
    for (int t = 0; t < c.num_tokens; ++t) {
      const int32_t pos = c.positions[static_cast<size_t>(t)];
      if (pos < 0 || pos >= visible) {
        return "position " + std::to_string(pos) + " outside the visible " +
               std::to_string(visible);
      }
      ++seen[static_cast<size_t>(c.layer * kHeads + c.kv_head)][static_cast<size_t>(pos)];
      std::vector<float> k(kDim), v(kDim);
      kernels::ConvertElements(c.keys.data() + static_cast<size_t>(t) * kDim * 2, DType::kF16,
                               k.data(), DType::kF32, kDim);
      kernels::ConvertElements(c.values.data() + static_cast<size_t>(t) * kDim * 2, DType::kF16,
                               v.data(), DType::kF32, kDim);
      for (int e = 0; e < kDim; ++e) {
        // INT8 keeps every element within half a step of absmax / 127 (< 0.07 here).
        const float want_k = KvValue(kSeed, c.layer, c.kv_head, pos, e, /*is_value=*/false);
        const float want_v = KvValue(kSeed, c.layer, c.kv_head, pos, e, /*is_value=*/true);
        if (std::fabs(k[e] - want_k) > 0.07f || std::fabs(v[e] - want_v) > 0.07f) {
          return "layer " + std::to_string(c.layer) + " head " + std::to_string(c.kv_head) +
                 " position " + std::to_string(pos) + " carries another token's data";
        }
      }
    }
  }
  for (size_t lane = 0; lane < seen.size(); ++lane) {
    for (int64_t pos = 0; pos < visible; ++pos) {
      if (seen[lane][static_cast<size_t>(pos)] != 1) {
        return "lane " + std::to_string(lane) + " position " + std::to_string(pos) + " served " +
               std::to_string(seen[lane][static_cast<size_t>(pos)]) + " times";
      }
    }
  }
  return "";
}

TEST_P(ConcurrentFetchTest, EveryFetchReturnsAStateThatExisted) {
  const Case& c = GetParam();
  PoolOptions pool;
  pool.device = testing::TestPoolDevice();
  pool.geometry = {kLayers, kHeads, kHeads, kDim, kBlock, DType::kF16, {}};
  pool.capacity_bytes = int64_t{64} << 20;
  KvStoreOptions options;
  options.pools.push_back(pool);
  KVC_ASSERT_OK_AND_ASSIGN(auto store, KvStore::Create(options));
  CreateSequenceParams create;
  create.policy.storage = c.storage;
  create.policy.storage_set = true;
  create.policy.residual_tokens = c.residual;
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot seq, store->CreateSequence(create));

  constexpr int64_t kTokens = 1500;
  std::atomic<bool> done{false};
  std::thread appender([&] {
    for (int64_t pos = 0; pos < kTokens; ++pos) {
      for (int l = 0; l < kLayers; ++l) {
        AppendParams a;
        a.sequence_id = seq.id;
        a.layer = l;
        a.start_position = pos;
        a.num_tokens = 1;
        const std::string k =
            MakeKv(kSeed, l, pos, 1, kHeads, kDim, DType::kF16, /*is_value=*/false);
        const std::string v =
            MakeKv(kSeed, l, pos, 1, kHeads, kDim, DType::kF16, /*is_value=*/true);
        a.keys = k;
        a.values = v;
        KVC_EXPECT_OK(store->Append(a));
      }
      // Let the reader in between appends, as a decode loop would, and now and then long
      // enough for a whole Fetch (a Fetch overlapping an aging append may end ABORTED; under
      // a sanitizer's slowdown it otherwise might never finish one).
      std::this_thread::sleep_for(std::chrono::microseconds(pos % 64 == 63 ? 5000 : 20));
    }
    done = true;
  });

  int ok = 0, aborted = 0, wrong = 0;
  std::string first_problem;
  while (!done) {
    FetchParams f;
    f.sequence_id = seq.id;
    f.max_chunk_bytes = 4096;  // many chunks per Fetch: more chances to interleave
    std::vector<FetchChunk> chunks;
    const absl::Status st = store->Fetch(f, [&](FetchChunk& chunk) {
      chunks.push_back(chunk);
      std::this_thread::yield();
      return true;
    });
    if (st.code() == absl::StatusCode::kAborted) {
      ++aborted;
      continue;
    }
    KVC_ASSERT_OK(st);
    const std::string problem = CheckSnapshot(chunks);
    if (problem.empty()) {
      ++ok;
    } else {
      ++wrong;
      if (first_problem.empty()) first_problem = problem;
    }
  }
  appender.join();
  EXPECT_EQ(wrong, 0) << wrong << " of " << (ok + wrong)
                      << " successful Fetches returned a state that never existed, e.g. "
                      << first_problem << " (" << aborted << " aborted)";
  EXPECT_GT(ok, 0) << "no Fetch completed (" << aborted << " aborted)";
}

INSTANTIATE_TEST_SUITE_P(Storage, ConcurrentFetchTest,
                         ::testing::Values(Case{"Int8Residual16", StorageFormat::kInt8, 16},
                                           Case{"Int8Residual5", StorageFormat::kInt8, 5},
                                           Case{"Int8", StorageFormat::kInt8, 0},
                                           Case{"F16Residual16", StorageFormat::kF16, 16}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace kvc::cachesvc
