// Checks a Fetch of a sequence kvc-loadgen appended (kv_pattern.h) against what the sequence
// must hold: every lane present, each lane's positions the right set, every key and value
// byte the pattern's for its position. A truncated, shifted or corrupted result fails.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvc/client/types.h"

namespace kvc::loadgen {

// What one fetched sequence must hold (f16 pool, f16 storage).
struct FetchExpectation {
  uint64_t sequence_key = 0;
  int num_layers = 0;  // every layer was fetched, in order
  int num_heads = 0;
  int head_dim = 0;
  int64_t visible_tokens = 0;
  enum class Kept {
    kAll,     // nothing evicted: positions [0, visible_tokens)
    kExact,   // exactly `positions` (StreamingLLM: sinks + the recent window)
    kSubset,  // `count` distinct positions including `positions` (SnapKV: scored + window)
  };
  Kept kept = Kept::kAll;
  std::vector<int32_t> positions;  // sorted
  int64_t count = 0;
  bool stored_format = false;  // records as stored: f16 rows of 2 * head_dim bytes
};

struct FetchCheck {
  int64_t tokens_checked = 0;  // (layer, head, token) rows compared
  int64_t wrong_bytes = 0;     // key/value bytes that differ from the pattern
  int64_t missing_rows = 0;    // rows a lane should hold but the result lacks
  std::string first_problem;   // empty = the result is exactly right
  bool ok() const { return first_problem.empty(); }
};

FetchCheck CheckFetch(const client::FetchResult& result, const FetchExpectation& expect);

}  // namespace kvc::loadgen
