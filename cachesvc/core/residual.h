// The raw recent residual (CompressionSpec.residual_tokens): the newest R tokens of every lane
// stay in the pool's raw format, in the sequence's second block table, and move into the
// low-bit part as they age out (KIVI keeps a full-precision recent window the same way:
// the newest tokens are the ones attention weighs most). Invariants, per layer: every kv head
// holds the same number of residual tokens, at most R, and each is newer than every token of
// the low-bit part of its lane — so eviction, which always keeps the newest tokens, never has
// to touch the residual as long as R fits in the policy's recent window (ValidateSpec).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "cachesvc/core/sequence.h"
#include "kvc/kernels/ops.h"

namespace kvc::cachesvc {

// How an append of `n` tokens to a lane holding `residual` raw tokens splits under a limit
// of `limit`: the `age` oldest residual tokens move to the low-bit part, the first `direct`
// new tokens go straight there, and the other n - direct join the residual.
struct ResidualSplit {
  int64_t age = 0;
  int64_t direct = 0;
};
ResidualSplit SplitAppend(int64_t residual, int64_t n, int64_t limit);

// Appends `n` tokens (keys/values [n, num_kv_heads, head_dim] of `dtype`) to `layer` of a
// sequence with residual_limit() > 0. All blocks are allocated before anything is written:
// RESOURCE_EXHAUSTED leaves the sequence unchanged.
absl::Status AppendWithResidualLocked(Sequence& seq, int layer, int64_t start, int64_t n,
                                      DType dtype, const char* keys, const char* values)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());

// SnapKV / H2O scoring of a layer whose lanes have a residual: the scores are a softmax over
// every stored key, so both parts are copied (dequantized, exactly, to f32) into one
// temporary lane per head, scored there, and the scores written back to each token's block.
// `args` carries everything but arena and lanes.
absl::Status ScoreWithResidualLocked(Sequence& seq, int layer, kernels::SnapKvScoreArgs args)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());

// Moves the `count` newest tokens of every lane of `layer` from the low-bit table (which must
// still be in the raw format) into the empty residual, byte for byte; blocks come from
// *fresh_raw. Used when a Compress sets the residual on a sequence stored raw until now.
absl::Status MoveNewestToResidualLocked(Sequence& seq, int layer, int64_t count,
                                        std::vector<BlockId>* fresh_raw)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());

}  // namespace kvc::cachesvc
