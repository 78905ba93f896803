// The eviction rule of a CompressionSpec, resolved once: which tokens a lane keeps (sinks,
// recent window, heavy hitters) and whether survivors get in-cache positions. Every path that
// evicts (automatic policies on append, Compress) goes through ResolveEviction.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "cachesvc/core/base/types.h"

namespace kvc::cachesvc {

// Upper bounds of a CompressionSpec's fields, checked by ValidateSpec (INVALID_ARGUMENT naming
// the field and the bound). Each caps what one request may make the service compute.
//
// Token counts (sinks, windows, budgets, heavy, recent, residual_tokens): 16M tokens, beyond
// the longest context any model serves, so a larger value can only be a mistake; it also keeps
// every sum of two of them far from int32 overflow.
inline constexpr int kMaxPolicyTokens = 1 << 24;
// SnapKV's pooling kernel: each prompt token's pooled score takes `pooling_kernel`
// comparisons, so an unbounded kernel made one Compress cost tokens^2 (~10^11 at 300K tokens).
// 129 is ten times the measured default (13); the cost stays below the scoring's own.
inline constexpr int kMaxPoolingKernel = 129;
// Query vectors a Compress scores with per layer (snapkv.window; H2O's prompt queries): each
// costs a pass over every stored token of the layer. The same bound as Attend's queries per call.
inline constexpr int kMaxScoringQueries = 4096;
// Expected Attention's RoPE average: each position costs num_layers x rotary_dim / 2 sin/cos
// pairs (~2 s per layer of head_dim 128 at the former bound of 2^20); 4096 is 8x kvpress's default
// of 512.
inline constexpr int kMaxFuturePositions = 4096;

struct EvictionRule {
  CompressionSpec::Eviction why = CompressionSpec::Eviction::kNone;
  int32_t sinks = 0;      // lowest positions always kept
  int32_t recent = 0;     // highest positions always kept
  int32_t budget = 0;     // highest-scoring others kept
  bool rerotate = false;  // survivors' keys re-rotated to consecutive in-cache positions
  bool scored = false;    // ranks by scores (SnapKV, H2O)
  // SnapKV's allocation: the layer's budget shared across its kv heads by score (AdaKV), each
  // head first taking floor_percent % of its share; per-layer budgets when pyramid_beta >= 2.
  bool adaptive = false;
  int32_t floor_percent = 0;
  int32_t pyramid_beta = 0;

  bool evicts() const { return why != CompressionSpec::Eviction::kNone; }
  // Tokens a lane keeps at most.
  int64_t keeps() const { return int64_t{sinks} + recent + budget; }
};

EvictionRule ResolveEviction(const CompressionSpec& spec);

// The heavy-hitter budget per kv head of `layer` (of `num_layers`): rule.budget, or with
// rule.pyramid_beta >= 2 PyramidKV's linear schedule with the same average, from
// budget + budget - budget / beta at layer 0 down to budget / beta at the last layer. `candidates`
// (the most tokens a head of the sequence can select) clamps layer 0 as PyramidKV does.
int32_t LayerBudget(const EvictionRule& rule, int layer, int num_layers, int64_t candidates);

const char* EvictionName(CompressionSpec::Eviction eviction);

// INVALID_ARGUMENT / FAILED_PRECONDITION naming the field when `spec` cannot apply to a
// pool of `geometry`. `automatic`: set at CreateSequence (SnapKV needs queries, so only a
// Compress can apply it).
absl::Status ValidateSpec(const CompressionSpec& spec, const PoolGeometry& geometry,
                          bool automatic);

// The newest tokens per lane that `spec`'s eviction always keeps (its recent window); -1 when
// it evicts nothing. A raw residual must fit in it.
int64_t ProtectedRecent(const CompressionSpec& spec);

}  // namespace kvc::cachesvc
