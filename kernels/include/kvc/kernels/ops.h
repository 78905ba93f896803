// Arguments of every kernel op. Each field states its shape; [a, b] means a dense row-major
// array. Pointers live in the backend's memory (device memory for CUDA). "Row" means one
// token of one lane (a (block id, slot) destination or source). Exact algorithms: the
// reference backend (kernels/reference/) and docs/KERNELS.md.
//
// Blocks hold token records only. Positions and scores are the caller's per-token metadata;
// ops that rank or mask tokens take them as [num_lanes, max_tokens] arrays (see LaneTable).
// An op that returns an error has written nothing, so a caller that writes only into blocks
// it has not published yet can abandon a half-done mutation without undo. Host backends
// validate everything before the first write. The CUDA backend checks arguments, its limits
// and its scratch allocations before it enqueues the first kernel that writes caller memory;
// only a failure of the CUDA runtime itself (kInternal: a launch the driver refuses, or a
// fault that Synchronize reports) can leave outputs partly written, and the device is then
// suspect anyway.
#pragma once

#include <math.h>

#include <cstdint>

#include "kvc/kernels/dtype.h"
#include "kvc/kernels/paged_view.h"
#include "kvc/kernels/rope.h"

namespace kvc::kernels {

// The softmax scale of SnapKvScore and DecodeAttention: 1/sqrt(head_dim). A model with
// another attention scale s folds it into its queries (q * s * sqrt(head_dim)): the logits
// are the same, so the ops need no scale argument.
KVC_HD float AttentionScale(int head_dim) { return 1.0f / sqrtf(static_cast<float>(head_dim)); }

// Quantizes rows of dense keys and values into their slots (scatter). Destinations must be
// distinct.
struct WriteTokensArgs {
  PagedArena arena;
  int32_t num_rows = 0;
  DType dtype = DType::kF16;            // element type of keys and values
  const void* keys = nullptr;           // [num_rows, row_stride], first head_dim used
  const void* values = nullptr;         // [num_rows, row_stride]
  int64_t row_stride = 0;               // elements between rows; 0 means head_dim
  const int32_t* dst_blocks = nullptr;  // [num_rows]
  const int32_t* dst_slots = nullptr;   // [num_rows] in [0, block_tokens)
};

// Dequantizes stored rows into dense arrays (gather). keys or values may be null to skip
// that output.
struct ReadTokensArgs {
  PagedArena arena;
  int32_t num_rows = 0;
  DType dtype = DType::kF16;            // element type of the outputs
  void* keys = nullptr;                 // [num_rows, row_stride]
  void* values = nullptr;               // [num_rows, row_stride]
  int64_t row_stride = 0;               // 0 means head_dim
  const int32_t* src_blocks = nullptr;  // [num_rows]
  const int32_t* src_slots = nullptr;   // [num_rows]
};

// Copies stored rows' records byte for byte into dense buffers (Fetch in the stored format):
// row r's key record to keys + r * record_bytes, its value record to values + r *
// record_bytes. keys or values may be null to skip that output; both must be 4-byte aligned.
struct ReadRecordsArgs {
  PagedArena arena;
  int32_t num_rows = 0;
  void* keys = nullptr;                 // [num_rows, record_bytes] bytes
  void* values = nullptr;               // [num_rows, record_bytes] bytes
  const int32_t* src_blocks = nullptr;  // [num_rows]
  const int32_t* src_slots = nullptr;   // [num_rows]
};

// Copies whole token records (K and V) byte for byte from (src block, slot) to (dst block,
// slot): into fresh blocks (copy-on-write compaction), or between arenas of the same format
// and head_dim. Source and destination slots must not overlap; destinations are distinct.
struct GatherArgs {
  PagedArena src;
  PagedArena dst;
  int32_t num_rows = 0;
  const int32_t* src_blocks = nullptr;  // [num_rows]
  const int32_t* src_slots = nullptr;   // [num_rows]
  const int32_t* dst_blocks = nullptr;  // [num_rows]
  const int32_t* dst_slots = nullptr;   // [num_rows]
};

// Rotates stored keys in place by a per-row position delta (new position - old position):
// exact for RoPE keys, used for StreamingLLM's in-cache positions. Quantized keys are
// dequantized, rotated in fp32 and requantized. Values are untouched; the caller updates
// its position metadata. Rows must be distinct.
struct RerotateArgs {
  PagedArena arena;
  int32_t num_rows = 0;
  const int32_t* blocks = nullptr;  // [num_rows]
  const int32_t* slots = nullptr;   // [num_rows]
  const int32_t* deltas = nullptr;  // [num_rows]
  RopeConfig rope;
};

// XXH64 (seed 0, kvc/kernels/xxh64.h) of each listed block's bytes: the whole block,
// layout.block_bytes (every slot's records and scales). The prefix cache's corruption check:
// taken when a block is published, compared when it is attached. The same bytes give the same
// value on every backend and on the host. Reads only.
struct ChecksumBlocksArgs {
  PagedArena arena;
  int32_t num_blocks = 0;
  const int32_t* blocks = nullptr;  // [num_blocks], each in [0, arena.num_blocks)
  uint64_t* checksums = nullptr;    // out [num_blocks]
};

enum class PoolKind : uint8_t { kMax = 0, kAvg = 1 };
enum class ScoreMode : uint8_t {
  kOverwrite = 0,   // scores := new score (SnapKV)
  kAccumulate = 1,  // scores += new score (H2O)
};

// SnapKV observation-window scores. For each query head of a lane's GQA group and each of
// its `window` queries: p = softmax(q.k / sqrt(head_dim)) over the lane's stored keys, keys with
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
  const int32_t* key_positions = nullptr;    // [num_lanes, lanes.max_tokens] of stored tokens
  int32_t pool_kernel = 7;                   // odd, >= 1
  PoolKind pool = PoolKind::kMax;
  ScoreMode mode = ScoreMode::kOverwrite;
  float* scores = nullptr;  // in/out [num_lanes, lanes.max_tokens]; slots past a lane's
                            // num_tokens are left as they are
};

// Expected Attention scores (kvpress ExpectedAttentionPress), query-agnostic: the queries
// still to come are modelled per query head as a Gaussian with mean `mean` and covariance
// `cov` (the caller already averaged them over the future positions' RoPE rotations), and a
// token's score is the attention it can expect, E[exp(q.k / sqrt(d))] =
// exp(k.mean / sqrt(d) + k^T cov k / (2 d)), normalized like attention. For each query head
// g of a lane's group: logit_t = k_t . mean_g / sqrt(head_dim) + k_t^T cov_g k_t /
// (2 head_dim) for the lane's stored tokens t with key position >= min_position (the sinks,
// always kept, stay out of the softmax as in kvpress); p = softmax over those t; score_t =
// mean over g of p_t, times ||v_t||_2 when value_norm. Stored tokens below min_position get
// score 0. Keys and values are read in the stored format; f32 accumulation. Scores are
// overwritten.
struct ExpectedAttentionScoreArgs {
  PagedArena arena;
  LaneTable lanes;
  int32_t group_size = 1;                  // query heads per kv head
  const float* mean = nullptr;             // [num_lanes, group_size, head_dim]
  const float* cov = nullptr;              // [num_lanes, group_size, head_dim, head_dim], or null:
                                           // no second-order term
  const int32_t* key_positions = nullptr;  // [num_lanes, lanes.max_tokens] of stored tokens
  int32_t min_position = 0;                // >= 0
  bool value_norm = true;
  float* scores = nullptr;  // out [num_lanes, lanes.max_tokens]; slots past a lane's
                            // num_tokens are left as they are
};

// Adds one decode step's attention weights to the per-token H2O scores: scores[l, t] +=
// mean over g of weights[l, g, t], for t < num_tokens[l]. Touches no KV memory.
struct AccumulateScoresArgs {
  int32_t num_lanes = 0;
  const int32_t* num_tokens = nullptr;  // [num_lanes]
  int32_t max_tokens = 0;               // >= every num_tokens[l]: the row stride
  int32_t group_size = 1;
  const float* weights = nullptr;  // [num_lanes, group_size, max_tokens]
  float* scores = nullptr;         // in/out [num_lanes, max_tokens]
};

// Chooses the tokens to keep per lane from their metadata alone: the `sinks` lowest
// positions, the `recent` highest positions, plus the `budget` highest scores among the rest
// (ties: lowest position wins, then lowest index; NaN scores rank lowest). Lanes with no more
// tokens than that keep everything. Touches no KV memory.
struct SelectArgs {
  int32_t num_lanes = 0;
  const int32_t* num_tokens = nullptr;  // [num_lanes]
  int32_t max_tokens = 0;               // >= every num_tokens[l]: the row stride
  const int32_t* positions = nullptr;   // [num_lanes, max_tokens]
  const float* scores = nullptr;        // [num_lanes, max_tokens]
  int32_t sinks = 0;
  int32_t recent = 0;
  int32_t budget = 0;  // heavy hitters kept per lane
  // Optional [num_lanes]: each lane's own heavy-hitter budget in place of `budget` (from
  // AllocateBudgets); a negative entry counts as 0.
  const int32_t* budgets = nullptr;
  uint8_t* keep = nullptr;  // out [num_lanes, max_tokens], 1 = keep, by stored index; slots
                            // past a lane's num_tokens are written 0
};

// Shares heavy-hitter budgets among lanes by their scores (AdaKV), for Select's `budgets`.
// Lanes [g * group_lanes, (g + 1) * group_lanes) form group g (the kv heads of one layer). A
// lane's candidates are the tokens Select ranks: all but its `sinks` lowest and `recent`
// highest positions. Each lane first takes its `floor` best candidates (all of them if it has
// fewer). The rest of the group's total, totals[g] minus what the floors took (nothing when
// that is negative), goes to the best of the remaining candidates over all the group's lanes,
// ranked as Select ranks within a lane: score descending (NaN lowest), then position
// ascending, then lower lane, then lower stored index. budgets[l] = the lane's floor share + its
// candidates among those, so Select with `budgets` keeps exactly the chosen tokens, and a
// group's budgets sum to min(max(totals[g], floors), its candidates). Scores must be comparable
// across the group's lanes (SnapKV and H2O scores are attention probability mass). Touches no
// KV memory.
struct AllocateBudgetsArgs {
  int32_t num_lanes = 0;                // a multiple of group_lanes
  const int32_t* num_tokens = nullptr;  // [num_lanes]
  int32_t max_tokens = 0;               // >= every num_tokens[l]: the row stride
  const int32_t* positions = nullptr;   // [num_lanes, max_tokens]
  const float* scores = nullptr;        // [num_lanes, max_tokens]
  int32_t sinks = 0;
  int32_t recent = 0;
  int32_t group_lanes = 1;          // lanes per group, >= 1
  const int32_t* totals = nullptr;  // [num_lanes / group_lanes]; a negative entry counts as 0
  int32_t floor = 0;                // candidates every lane keeps first, >= 0
  int32_t* budgets = nullptr;       // out [num_lanes]
};

// One decode step of paged attention. For each lane and each of its group_size query heads:
// out = softmax(q.K / sqrt(head_dim)) V over the lane's stored tokens, read directly in the stored
// format, with a max-subtracted softmax and fp32 accumulation. A lane with no tokens gives
// zeros. `lse` lets a caller merge attention computed over disjoint token sets (e.g. a
// low-bit part and a raw recent part): out = sum_i exp(lse_i - LSE) out_i with
// LSE = log sum_i exp(lse_i), and each part's weights scale by exp(lse_i - LSE).
struct DecodeAttentionArgs {
  PagedArena arena;
  LaneTable lanes;
  int32_t group_size = 1;
  DType dtype = DType::kF16;      // element type of queries and out
  const void* queries = nullptr;  // [num_lanes, group_size, head_dim]
  void* out = nullptr;            // [num_lanes, group_size, head_dim]
  float* weights = nullptr;       // optional out [num_lanes, group_size, lanes.max_tokens]
  // Optional in/out [num_lanes, lanes.max_tokens]: += the group mean of this step's weights
  // (H2O scores, as AccumulateScores).
  float* scores = nullptr;
  // Optional out [num_lanes, group_size]: log sum_t exp(q.k_t / sqrt(head_dim)), natural log, the
  // softmax's log-normalizer; -infinity for a lane with no tokens.
  float* lse = nullptr;
};

}  // namespace kvc::kernels
