// Arguments of every kernel op. Each field states its shape; [a, b] means a dense row-major
// array. Pointers live in the backend's memory (device memory for CUDA). "Row" means one
// token of one lane (a (block id, slot) destination or source). Exact algorithms: the
// reference backend (kernels/reference/) and docs/KERNELS.md.
#pragma once

#include <cstdint>

#include "kvc/kernels/dtype.h"
#include "kvc/kernels/paged_view.h"

namespace kvc::kernels {

// Quantizes rows of dense keys and values into their slots (scatter). The slot's position
// is set and its score reset to 0. Destinations must be distinct.
struct WriteTokensArgs {
  PagedArena arena;
  int32_t num_rows = 0;
  DType dtype = DType::kF16;            // element type of keys and values
  const void* keys = nullptr;           // [num_rows, row_stride], first head_dim used
  const void* values = nullptr;         // [num_rows, row_stride]
  int64_t row_stride = 0;               // elements between rows; 0 means head_dim
  const int32_t* positions = nullptr;   // [num_rows] original token positions
  const int32_t* dst_blocks = nullptr;  // [num_rows]
  const int32_t* dst_slots = nullptr;   // [num_rows] in [0, block_tokens)
};

// Dequantizes stored rows into dense arrays (gather). keys/values/positions/scores may each
// be null to skip that output.
struct ReadTokensArgs {
  PagedArena arena;
  int32_t num_rows = 0;
  DType dtype = DType::kF16;            // element type of the outputs
  void* keys = nullptr;                 // [num_rows, row_stride]
  void* values = nullptr;               // [num_rows, row_stride]
  int64_t row_stride = 0;               // 0 means head_dim
  int32_t* positions = nullptr;         // [num_rows]
  float* scores = nullptr;              // [num_rows]
  const int32_t* src_blocks = nullptr;  // [num_rows]
  const int32_t* src_slots = nullptr;   // [num_rows]
};

// Copies whole token records (K, V, position, score) byte for byte from (src block, slot)
// to (dst block, slot): gather into fresh blocks, or between arenas of the same format and
// head_dim. Source and destination slots must not overlap.
struct GatherArgs {
  PagedArena src;
  PagedArena dst;
  int32_t num_rows = 0;
  const int32_t* src_blocks = nullptr;  // [num_rows]
  const int32_t* src_slots = nullptr;   // [num_rows]
  const int32_t* dst_blocks = nullptr;  // [num_rows]
  const int32_t* dst_slots = nullptr;   // [num_rows]
};

enum class RopeStyle : uint8_t {
  kNeox = 0,  // pairs (i, i + rotary_dim / 2) ("rotate half"; Llama, NeoX)
  kGptJ = 1,  // pairs (2i, 2i + 1) (interleaved; GPT-J)
};

struct RopeConfig {
  float theta = 10000.0f;  // base: inv_freq[i] = theta^(-2i / rotary_dim)
  int32_t rotary_dim = 0;  // leading dims rotated; 0 means head_dim; even
  RopeStyle style = RopeStyle::kNeox;
};

// Rotates stored keys by a per-row position delta (new position - old position): exact for
// RoPE keys, used for StreamingLLM's in-cache positions. Quantized keys are dequantized,
// rotated in fp32 and requantized. Values are untouched.
struct RerotateArgs {
  PagedArena arena;
  int32_t num_rows = 0;
  const int32_t* blocks = nullptr;  // [num_rows]
  const int32_t* slots = nullptr;   // [num_rows]
  const int32_t* deltas = nullptr;  // [num_rows]
  RopeConfig rope;
  bool update_positions = true;  // also add the delta to the stored position
};

enum class PoolKind : uint8_t { kMax = 0, kAvg = 1 };
enum class ScoreMode : uint8_t {
  kOverwrite = 0,   // block score := new score (SnapKV)
  kAccumulate = 1,  // block score += new score (H2O)
};

// SnapKV observation-window scores. For each query head of a lane's GQA group and each of
// its `window` queries: p = softmax(scale * q.k) over the lane's stored keys, keys with
// position > query position masked (the causal mask inside the window); summed over the
// window; smoothed along stored order by 1-D pooling (kernel pool_kernel, stride 1,
// padding pool_kernel / 2; avg divides by pool_kernel) over the first num_tokens - window
// slots (the window's own keys are neither pooled nor neighbours, as in SnapKV); then
// averaged over the group. H2O's prefill scores are this op with window = all prompt
// queries, pool_kernel = 1.
struct SnapKvScoreArgs {
  PagedArena arena;
  LaneTable lanes;
  int32_t group_size = 1;  // query heads per kv head
  int32_t window = 0;      // queries per query head
  DType query_dtype = DType::kF16;
  const void* queries = nullptr;             // [num_lanes, group_size, window, head_dim]
  const int32_t* query_positions = nullptr;  // [num_lanes, window]
  float scale = 0.0f;                        // 0 means 1/sqrt(head_dim)
  int32_t pool_kernel = 7;                   // odd, >= 1
  PoolKind pool = PoolKind::kMax;
  ScoreMode mode = ScoreMode::kOverwrite;  // how results land in the block score fields
  float* out_scores = nullptr;             // optional [num_lanes, lanes.max_tokens]
};

// Adds one decode step's attention weights to the per-token H2O scores: block score of
// stored token t of lane l += mean over g of weights[l, g, t].
struct AccumulateScoresArgs {
  PagedArena arena;
  LaneTable lanes;
  int32_t group_size = 1;
  const float* weights = nullptr;  // [num_lanes, group_size, lanes.max_tokens]
};

// Chooses the tokens to keep per lane: the `sinks` lowest positions, the `recent` highest
// positions, plus the `budget` highest block scores among the rest (ties: lowest position
// wins; NaN scores rank lowest). Lanes with no more tokens than that keep everything.
struct SelectArgs {
  PagedArena arena;
  LaneTable lanes;
  int32_t sinks = 0;
  int32_t recent = 0;
  int32_t budget = 0;                // heavy hitters kept per lane (when `budgets` is null)
  const int32_t* budgets = nullptr;  // optional [num_lanes], overrides `budget`
  uint8_t* keep = nullptr;           // out [num_lanes, lanes.max_tokens], 1 = keep, by stored index
  int32_t* kept = nullptr;           // optional out [num_lanes], tokens kept
};

// Tail-to-hole compaction: the j-th kept token at stored index >= kept count moves into the
// j-th dropped slot below it (both ascending), so kept tokens fill the prefix of the lane
// and blocks [new_num_blocks, lane blocks) become free. Positions and scores move too.
struct CompactArgs {
  PagedArena arena;
  LaneTable lanes;
  const uint8_t* keep = nullptr;      // [num_lanes, lanes.max_tokens]
  int32_t* new_num_tokens = nullptr;  // out [num_lanes]
  int32_t* new_num_blocks = nullptr;  // out [num_lanes] = ceil(new tokens / block_tokens)
  int32_t* moved = nullptr;           // optional out [num_lanes], tokens moved
};

// One decode step of paged attention. For each lane and each of its group_size query heads:
// out = softmax(scale * q.K) V over the lane's stored tokens, read directly in the stored
// format, with a max-subtracted softmax and fp32 accumulation. A lane with no tokens gives
// zeros. `lse` lets a caller merge attention computed over disjoint token sets (e.g. a
// low-bit part and a raw recent part): out = sum_i exp(lse_i - LSE) out_i with
// LSE = log sum_i exp(lse_i), and each part's weights scale by exp(lse_i - LSE).
struct DecodeAttentionArgs {
  PagedArena arena;
  LaneTable lanes;
  int32_t group_size = 1;
  DType dtype = DType::kF16;       // element type of queries and out
  const void* queries = nullptr;   // [num_lanes, group_size, head_dim]
  void* out = nullptr;             // [num_lanes, group_size, head_dim]
  float scale = 0.0f;              // 0 means 1/sqrt(head_dim)
  float* weights = nullptr;        // optional out [num_lanes, group_size, lanes.max_tokens]
  bool accumulate_scores = false;  // add the group mean of the weights to block scores (H2O)
  // Optional out [num_lanes, group_size]: log sum_t exp(scale * q.k_t), natural log, the
  // softmax's log-normalizer; -infinity for a lane with no tokens.
  float* lse = nullptr;
};

}  // namespace kvc::kernels
