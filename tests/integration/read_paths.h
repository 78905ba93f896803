// Helpers of the read-path tests (same-node mapping, transfer channels): sequences of the
// small test pool filled with known KV, and a field-by-field comparison of two Fetches.
#pragma once

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvc/client/kv_cache_client.h"
#include "tests/testing/kv_data.h"

namespace kvc::testing {

constexpr int kLayers = 4, kHeads = 2, kDim = 32;

inline absl::Status Prefill(client::KvCacheClient& c, const std::string& id, int n,
                            int layers = kLayers) {
  for (int l = 0; l < layers; ++l) {
    const std::string k =
        MakeKv(5, l, 0, n, kHeads, kDim, kernels::DType::kF16, /*is_value=*/false);
    const std::string v = MakeKv(5, l, 0, n, kHeads, kDim, kernels::DType::kF16, /*is_value=*/true);
    client::AppendChunk a;
    a.sequence_id = id;
    a.layer = l;
    a.start_position = 0;
    a.num_tokens = n;
    a.dtype = client::DType::kF16;
    a.keys = k.data();
    a.values = v.data();
    a.bytes = k.size();
    if (auto r = c.Append(a); !r.ok()) return r.status();
  }
  return absl::OkStatus();
}

// A new sequence with `n` tokens in its first `layers` layers.
inline absl::StatusOr<std::string> Filled(client::KvCacheClient& c, int n,
                                          const client::CreateSequenceOptions& options = {},
                                          int layers = kLayers) {
  absl::StatusOr<client::SequenceInfo> s = c.CreateSequence(options);
  if (!s.ok()) return s.status();
  if (absl::Status p = Prefill(c, s->sequence_id, n, layers); !p.ok()) return p;
  return s->sequence_id;
}

// INT4 with a raw residual window: two segments per lane, two arenas.
inline client::CreateSequenceOptions Int4WithResidual() {
  client::CreateSequenceOptions o;
  o.policy = client::CompressionSpec{}.WithStorage(client::StorageFormat::kInt4G32);
  o.policy.residual_tokens = 16;
  return o;
}

// The Fetch options both read paths are compared on: the pool's dtype, f32, stored records,
// a layer subset out of order, bf16, and unfinished layers.
inline std::vector<client::FetchOptions> FetchCases() {
  std::vector<client::FetchOptions> cases(6);
  cases[1].dtype = client::DType::kF32;
  cases[2].stored_format = true;
  cases[3].layers = {2, 0};
  cases[4].dtype = client::DType::kBF16;
  cases[5].include_unfinished = true;
  return cases;
}

inline void ExpectSame(const client::FetchResult& a, const client::FetchResult& b) {
  EXPECT_EQ(a.visible_tokens, b.visible_tokens);
  EXPECT_EQ(a.dtype, b.dtype);
  ASSERT_EQ(a.heads.size(), b.heads.size());
  for (size_t i = 0; i < a.heads.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "head " << i);
    EXPECT_EQ(a.heads[i].layer, b.heads[i].layer);
    EXPECT_EQ(a.heads[i].kv_head, b.heads[i].kv_head);
    EXPECT_EQ(a.heads[i].first_index, b.heads[i].first_index);
    EXPECT_EQ(a.heads[i].storage, b.heads[i].storage);
    EXPECT_EQ(a.heads[i].record_bytes, b.heads[i].record_bytes);
    EXPECT_EQ(a.heads[i].positions, b.heads[i].positions);
    EXPECT_TRUE(a.heads[i].keys == b.heads[i].keys) << "keys differ";
    EXPECT_TRUE(a.heads[i].values == b.heads[i].values) << "values differ";
  }
}

// FetchInto of layers {2, 0} through `c` writes exactly the rows and positions `reference`'s
// Fetch returns, and leaves every row past a lane's tokens as it was.
inline void ExpectFetchIntoMatchesFetch(client::KvCacheClient& c, client::KvCacheClient& reference,
                                        const std::string& id, client::DType dtype,
                                        bool unfinished) {
  constexpr int64_t kCapacity = 128;
  const std::vector<int32_t> layers = {2, 0};
  const size_t row = kDim * (dtype == client::DType::kF32 ? 4 : 2);
  const size_t bytes = kHeads * kCapacity * row;
  client::FetchOptions fetch;
  fetch.layers = {2, 0};
  fetch.dtype = dtype;
  fetch.include_unfinished = unfinished;
  absl::StatusOr<client::FetchResult> want = reference.Fetch(id, fetch);
  ASSERT_TRUE(want.ok()) << want.status();
  std::vector<std::string> keys(layers.size(), std::string(bytes, '\xab'));
  std::vector<std::string> values = keys;
  std::vector<client::LayerBuffers> buffers;
  for (size_t b = 0; b < layers.size(); ++b) {
    buffers.push_back({layers[b], keys[b].data(), values[b].data(), kCapacity});
  }
  client::FetchIntoOptions into;
  into.dtype = dtype;
  into.num_kv_heads = kHeads;
  into.head_dim = kDim;
  into.include_unfinished = unfinished;
  into.positions = true;
  absl::StatusOr<client::FetchIntoResult> got = c.FetchInto(id, buffers, into);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->visible_tokens, want->visible_tokens);
  ASSERT_EQ(got->lane_tokens.size(), layers.size() * kHeads);
  std::vector<int32_t> positions;
  for (size_t lane = 0; lane < got->lane_tokens.size(); ++lane) {
    const size_t b = lane / kHeads, h = lane % kHeads;
    const auto n = static_cast<size_t>(got->lane_tokens[lane]);
    // Fetch lists a lane once per (layer, head), or not at all when it has no tokens.
    const client::FetchedHead* head = nullptr;
    for (const client::FetchedHead& fh : want->heads) {
      if (fh.layer == layers[b] && fh.kv_head == static_cast<int>(h)) head = &fh;
    }
    ASSERT_EQ(n, head == nullptr ? 0 : head->positions.size()) << "lane " << lane;
    if (head == nullptr) continue;
    positions.insert(positions.end(), head->positions.begin(), head->positions.end());
    const size_t at = h * kCapacity * row;
    EXPECT_TRUE(keys[b].compare(at, n * row, head->keys) == 0) << "keys, lane " << lane;
    EXPECT_TRUE(values[b].compare(at, n * row, head->values) == 0) << "lane " << lane;
    EXPECT_EQ(keys[b].substr(at + n * row, (kCapacity - n) * row),
              std::string((kCapacity - n) * row, '\xab'))
        << "rows past the lane's tokens were written, lane " << lane;
  }
  EXPECT_EQ(got->positions, positions);
}

}  // namespace kvc::testing
