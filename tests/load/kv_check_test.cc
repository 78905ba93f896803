// kvc-loadgen's Fetch checkers. The mixed mode's (kv_check.h): a correct result passes; one
// flipped byte, one missing token, shifted positions, a missing lane, or the wrong kept set
// each fail it. The prefill mode's (dense_check.h): the same for what it appended, keys and
// values alike.
#include "client/tools/loadgen/kv_check.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "client/tools/loadgen/dense_check.h"
#include "client/tools/loadgen/kv_pattern.h"
#include "gtest/gtest.h"

namespace kvc::loadgen {
namespace {

using client::FetchedHead;
using client::FetchResult;
using Kept = FetchExpectation::Kept;

constexpr int kLayers = 2, kHeads = 3, kDim = 8;
constexpr uint64_t kKey = 42;

// What a correct Fetch of `positions` (per lane, in this order) returns.
FetchResult Correct(const std::vector<int32_t>& positions, int64_t visible) {
  FetchResult r;
  r.visible_tokens = visible;
  r.dtype = client::DType::kF16;
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kHeads; ++h) {
      FetchedHead lane;
      lane.layer = l;
      lane.kv_head = h;
      lane.positions = positions;
      std::string row(2 * kDim, '\0');
      for (int32_t p : positions) {
        PatternRow(kKey, l, h, p, kDim, /*is_value=*/false, row.data());
        lane.keys += row;
        PatternRow(kKey, l, h, p, kDim, /*is_value=*/true, row.data());
        lane.values += row;
      }
      r.heads.push_back(std::move(lane));
    }
  }
  return r;
}

FetchExpectation All(int64_t visible) {
  FetchExpectation e;
  e.sequence_key = kKey;
  e.num_layers = kLayers;
  e.num_heads = kHeads;
  e.head_dim = kDim;
  e.visible_tokens = visible;
  return e;
}

std::vector<int32_t> Range(int32_t from, int32_t to) {
  std::vector<int32_t> v;
  for (int32_t p = from; p < to; ++p) v.push_back(p);
  return v;
}

TEST(KvPatternTest, AppendLayoutMatchesFetchRows) {
  const std::string tokens = PatternTokens(kKey, 1, 5, 2, kHeads, kDim, /*is_value=*/true);
  std::string row(2 * kDim, '\0');
  PatternRow(kKey, 1, 2, 6, kDim, /*is_value=*/true, row.data());
  // Token 1 (position 6), head 2 of [n, heads, head_dim].
  EXPECT_EQ(tokens.substr((1 * kHeads + 2) * row.size(), row.size()), row);
  EXPECT_NE(PatternBits(kKey, 1, 2, 6, 0, false), PatternBits(kKey, 1, 2, 7, 0, false));
  EXPECT_NE(PatternBits(kKey, 1, 2, 6, 0, false), PatternBits(kKey + 1, 1, 2, 6, 0, false));
}

TEST(KvCheckTest, CorrectResultPasses) {
  const FetchCheck c = CheckFetch(Correct(Range(0, 40), 40), All(40));
  EXPECT_TRUE(c.ok()) << c.first_problem;
  EXPECT_EQ(c.tokens_checked, kLayers * kHeads * 40);
  EXPECT_EQ(c.wrong_bytes, 0);
}

TEST(KvCheckTest, OneFlippedByteFails) {
  for (const bool in_values : {false, true}) {
    FetchResult r = Correct(Range(0, 40), 40);
    std::string& bytes = in_values ? r.heads[4].values : r.heads[4].keys;
    bytes[17 * 2 * kDim + 3] ^= 0x01;
    const FetchCheck c = CheckFetch(r, All(40));
    EXPECT_FALSE(c.ok());
    EXPECT_EQ(c.wrong_bytes, 1);
    EXPECT_NE(c.first_problem.find("position 17"), std::string::npos) << c.first_problem;
  }
}

TEST(KvCheckTest, OneMissingTokenFails) {
  FetchResult r = Correct(Range(0, 40), 40);
  // The last token of one lane, as a truncated stream would leave it.
  r.heads.back().positions.pop_back();
  r.heads.back().keys.resize(r.heads.back().keys.size() - 2 * kDim);
  r.heads.back().values.resize(r.heads.back().values.size() - 2 * kDim);
  const FetchCheck c = CheckFetch(r, All(40));
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.missing_rows, 1);
}

TEST(KvCheckTest, MissingLaneFails) {
  FetchResult r = Correct(Range(0, 40), 40);
  r.heads.pop_back();  // a stream that ended one lane early
  const FetchCheck c = CheckFetch(r, All(40));
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.missing_rows, 40);
}

TEST(KvCheckTest, ShiftedPositionsFail) {
  // The bytes of positions 0..39 labelled 1..40: both the set and the bytes are wrong.
  FetchResult r = Correct(Range(0, 40), 41);
  for (auto& lane : r.heads)
    for (auto& p : lane.positions) ++p;
  FetchExpectation e = All(41);
  e.kept = Kept::kExact;
  e.positions = Range(1, 41);
  const FetchCheck c = CheckFetch(r, e);
  EXPECT_FALSE(c.ok());
  EXPECT_GT(c.wrong_bytes, 0);
}

TEST(KvCheckTest, ExactKeptSet) {
  // StreamingLLM 4 + 8 of 40: positions 0..3 and 32..39, in any order within a lane.
  std::vector<int32_t> kept = Range(0, 4);
  for (int32_t p : Range(32, 40)) kept.push_back(p);
  FetchExpectation e = All(40);
  e.kept = Kept::kExact;
  e.positions = kept;
  std::vector<int32_t> compacted = {0, 1, 2, 3, 36, 37, 38, 39, 32, 33, 34, 35};
  EXPECT_TRUE(CheckFetch(Correct(compacted, 40), e).ok());
  kept[5] = 31;  // one position the eviction should have dropped, with its right bytes
  std::sort(kept.begin(), kept.end());
  EXPECT_FALSE(CheckFetch(Correct(kept, 40), e).ok());
}

TEST(KvCheckTest, SubsetMustHoldRequiredPositions) {
  FetchExpectation e = All(40);
  e.kept = Kept::kSubset;
  e.count = 10;
  e.positions = Range(36, 40);  // SnapKV's observation window
  std::vector<int32_t> kept = {1, 5, 7, 9, 20, 30, 36, 37, 38, 39};
  EXPECT_TRUE(CheckFetch(Correct(kept, 40), e).ok());
  kept[9] = 8;  // the window's last token dropped
  EXPECT_FALSE(CheckFetch(Correct(kept, 40), e).ok());
  kept.pop_back();  // nine instead of ten
  EXPECT_FALSE(CheckFetch(Correct(kept, 40), e).ok());
}

TEST(KvCheckTest, StoredFormatNeedsF16Records) {
  FetchResult r = Correct(Range(0, 8), 8);
  FetchExpectation e = All(8);
  e.stored_format = true;
  r.storage = client::StorageFormat::kF16;
  r.record_bytes = 2 * kDim;
  EXPECT_TRUE(CheckFetch(r, e).ok());
  r.storage = client::StorageFormat::kInt8;
  EXPECT_FALSE(CheckFetch(r, e).ok());
}

TEST(KvCheckTest, WrongVisibleLengthFails) {
  EXPECT_FALSE(CheckFetch(Correct(Range(0, 40), 40), All(41)).ok());
}

// The prefill mode: 2 layers x 3 heads x 4 tokens, 16-byte rows.
struct Appended {
  std::vector<std::string> keys, values;
  AppendedKv view() const { return {&keys, &values, kHeads, 16, 4}; }
  FetchResult Fetched() const {
    FetchResult r;
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kHeads; ++h) {
        FetchedHead lane;
        lane.layer = l;
        lane.kv_head = h;
        for (int t = 0; t < 4; ++t) {
          lane.positions.push_back(t);
          lane.keys += keys[l].substr((t * kHeads + h) * 16, 16);
          lane.values += values[l].substr((t * kHeads + h) * 16, 16);
        }
        r.heads.push_back(std::move(lane));
      }
    }
    return r;
  }
};

Appended MakeAppended() {
  Appended a;
  for (int l = 0; l < kLayers; ++l) {
    std::string k(4 * kHeads * 16, '\0'), v(4 * kHeads * 16, '\0');
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<char>(i * 7 + l);
      v[i] = static_cast<char>(i * 13 + l + 1);
    }
    a.keys.push_back(k);
    a.values.push_back(v);
  }
  return a;
}

TEST(DenseCheckTest, WhatWasAppendedPasses) {
  const Appended a = MakeAppended();
  EXPECT_TRUE(CheckDense(a.Fetched(), a.view()).ok());
}

// The bug this checker replaced: values were never compared.
TEST(DenseCheckTest, OneFlippedValueByteFails) {
  const Appended a = MakeAppended();
  FetchResult r = a.Fetched();
  r.heads[4].values[21] ^= 1;
  const absl::Status s = CheckDense(r, a.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "layer 1 head 1 token 1: the values differ");
}

TEST(DenseCheckTest, OneFlippedKeyByteFails) {
  const Appended a = MakeAppended();
  FetchResult r = a.Fetched();
  r.heads[0].keys[63] ^= 0x80;
  EXPECT_EQ(CheckDense(r, a.view()).message(), "layer 0 head 0 token 3: the keys differ");
}

TEST(DenseCheckTest, AMissingRepeatedOrShortLaneFails) {
  const Appended a = MakeAppended();
  FetchResult missing = a.Fetched();
  missing.heads.pop_back();
  EXPECT_EQ(CheckDense(missing, a.view()).message(), "5 of 6 (layer, head) lanes came back");
  FetchResult repeated = a.Fetched();
  repeated.heads[1] = repeated.heads[0];
  EXPECT_EQ(CheckDense(repeated, a.view()).message(), "layer 0 head 0 came twice");
  FetchResult short_lane = a.Fetched();
  short_lane.heads[2].positions.pop_back();
  short_lane.heads[2].keys.resize(48);
  short_lane.heads[2].values.resize(48);
  EXPECT_FALSE(CheckDense(short_lane, a.view()).ok());
  FetchResult shifted = a.Fetched();
  shifted.heads[3].positions[0] = 1;
  EXPECT_EQ(CheckDense(shifted, a.view()).message(), "layer 1 head 0 token 0 has position 1");
}

}  // namespace
}  // namespace kvc::loadgen
