#include "cachesvc/core/ops/attend.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/ops/transaction.h"
#include "cachesvc/core/pool/op_stage.h"
#include "cachesvc/core/sequence/tier_lanes.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Part {
  int tier = 0;
  TierLanes lanes;
  kernels::PagedArena arena;
};

// An upper bound on the encoded response, checked before any attention is computed.
// weight_positions are varints: a position < 2^31 takes at most 5 bytes, a -1 pad 10.
absl::Status CheckResponseSize(const AttendParams& p, const PoolGeometry& g, int64_t row_bytes,
                               int64_t max_stored, int64_t total_stored, int64_t limit) {
  const int64_t n = static_cast<int64_t>(p.positions.size());
  const int64_t output = n * row_bytes;
  const int64_t pads = int64_t{g.num_kv_heads} * max_stored - total_stored;
  const int64_t weights =
      p.want_weights ? n * g.num_query_heads * max_stored * 4 + total_stored * 5 + pads * 10 : 0;
  if (output + weights <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "Attend would return ", output + weights, " bytes (", output, " of output",
      p.want_weights
          ? absl::StrCat(", ", weights, " of weights over ", max_stored, " stored tokens")
          : std::string(),
      ") but a response may carry at most ", limit, "; send fewer queries per call",
      p.want_weights ? " or set return_weights false" : ""));
}

// Attention of query i over every part, merged by log-sum-exp; adds the merged weights to
// the parts' score copies and, with want_weights, writes them into `weights_out`.
absl::Status AttendMerged(const Sequence& seq, std::vector<Part>& parts, const float* q32,
                          float* out32, float* weights_out, int32_t max_stored)
    ABSL_SHARED_LOCKS_REQUIRED(seq.mu()) {
  const PoolGeometry& g = seq.geometry();
  const int group = g.num_query_heads / g.num_kv_heads, d = g.head_dim;
  const size_t nq = static_cast<size_t>(g.num_query_heads);
  std::vector<std::vector<float>> out(parts.size()), lse(parts.size()), w(parts.size());
  OpStage stage(seq.pool());
  const float* q = stage.In(q32, nq * static_cast<size_t>(d));
  for (size_t k = 0; k < parts.size(); ++k) {
    out[k].resize(nq * static_cast<size_t>(d));
    lse[k].resize(nq);
    w[k].resize(nq * static_cast<size_t>(parts[k].lanes.max_tokens));
    kernels::DecodeAttentionArgs a;
    a.arena = parts[k].arena;
    a.lanes = stage.In(parts[k].lanes.view());
    a.group_size = group;
    a.dtype = DType::kF32;
    a.queries = q;
    a.out = stage.Out(out[k].data(), out[k].size());
    a.weights = stage.Out(w[k].data(), w[k].size());
    a.lse = stage.Out(lse[k].data(), lse[k].size());
    KVC_RETURN_IF_ERROR(stage.Launch("DecodeAttention", [&](kernels::StreamHandle s) {
      return seq.pool()->backend()->DecodeAttention(a, s);
    }));
  }
  // The parts are merged on the host: a few kilobytes per query token.
  KVC_RETURN_IF_ERROR(stage.Finish());
  for (size_t r = 0; r < nq; ++r) {
    float m = kNegInf;
    for (size_t k = 0; k < parts.size(); ++k) m = std::max(m, lse[k][r]);
    float total = 0.0f;
    for (size_t k = 0; k < parts.size(); ++k)
      total += m == kNegInf ? 0.0f : std::exp(lse[k][r] - m);
    for (int j = 0; j < d; ++j) out32[r * static_cast<size_t>(d) + static_cast<size_t>(j)] = 0.0f;
    size_t at = 0;
    const int h = static_cast<int>(r) / group;
    for (size_t k = 0; k < parts.size(); ++k) {
      const float f = m == kNegInf ? 0.0f : std::exp(lse[k][r] - m) / total;
      const size_t stride = static_cast<size_t>(parts[k].lanes.max_tokens);
      for (int j = 0; j < d; ++j) {
        const size_t e = r * static_cast<size_t>(d) + static_cast<size_t>(j);
        if (f != 0.0f) out32[e] += f * out[k][e];
      }
      for (size_t t = 0; t < stride; ++t) w[k][r * stride + t] *= f;
      if (weights_out != nullptr) {
        const size_t count = static_cast<size_t>(parts[k].lanes.num_tokens[static_cast<size_t>(h)]);
        std::copy_n(w[k].begin() + static_cast<std::ptrdiff_t>(r * stride), count,
                    weights_out + r * static_cast<size_t>(max_stored) + at);
        at += count;
      }
    }
  }
  // H2O: every token's score grows by its weight in the merged softmax.
  for (size_t k = 0; k < parts.size(); ++k) {
    kernels::AccumulateScoresArgs acc;
    acc.num_lanes = parts[k].lanes.num_lanes();
    acc.num_tokens = parts[k].lanes.num_tokens.data();
    acc.max_tokens = parts[k].lanes.max_tokens;
    acc.group_size = group;
    acc.weights = w[k].data();
    acc.scores = parts[k].lanes.scores.data();
    if (auto ks = seq.pool()->metadata_backend()->AccumulateScores(acc, {}); !ks.ok()) {
      return KernelFailure(ks, "AccumulateScores");
    }
  }
  return absl::OkStatus();
}

// One query token over one part: the kernel writes the caller's dtype and adds the weights to
// the scores. `lanes` and `scores` are staged once for all of the call's tokens.
absl::Status AttendOnePart(const Sequence& seq, OpStage& stage, const Part& part,
                           const kernels::LaneTable& lanes, float* scores, DType dtype,
                           const char* queries, size_t query_bytes, char* out, float* weights,
                           size_t weight_count) ABSL_SHARED_LOCKS_REQUIRED(seq.mu()) {
  const PoolGeometry& g = seq.geometry();
  kernels::DecodeAttentionArgs a;
  a.arena = part.arena;
  a.lanes = lanes;
  a.group_size = g.num_query_heads / g.num_kv_heads;
  a.dtype = dtype;
  a.queries = stage.In(queries, query_bytes);
  a.out = stage.Out(out, query_bytes);  // [num_query_heads, head_dim] of dtype, as the queries
  a.weights = stage.Out(weights, weight_count);
  a.scores = scores;
  return stage.Launch("DecodeAttention", [&](kernels::StreamHandle s) {
    return seq.pool()->backend()->DecodeAttention(a, s);
  });
}

// The position of each weight's token, [num_kv_heads, max_stored] (-1 = padding), tiers in
// the order the weights are.
std::vector<int32_t> WeightPositions(const SequenceStorage& st, int layer, int32_t max_stored) {
  std::vector<int32_t> out(static_cast<size_t>(st.num_kv_heads()) * static_cast<size_t>(max_stored),
                           -1);
  for (int h = 0; h < st.num_kv_heads(); ++h) {
    size_t at = static_cast<size_t>(h) * static_cast<size_t>(max_stored);
    for (const Segment& s : st.lane(layer, h)) {
      std::copy(s.positions.begin(), s.positions.end(),
                out.begin() + static_cast<std::ptrdiff_t>(at));
      at += s.positions.size();
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<DType> ValidateAttend(const AttendParams& p, const PoolOptions& pool) {
  const PoolGeometry& g = pool.geometry;
  if (p.layer < 0 || p.layer >= g.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", p.layer, " is out of range: pool '",
                                                   pool.name, "' has ", g.num_layers,
                                                   " layers (0..", g.num_layers - 1, ")"));
  }
  const int64_t n = static_cast<int64_t>(p.positions.size());
  if (n < 1 || n > kMaxAttendQueries) {
    return absl::InvalidArgumentError(absl::StrCat("positions has ", n, " entries; expected 1..",
                                                   kMaxAttendQueries, " (one per query token)"));
  }
  const DType dtype = p.dtype.value_or(g.dtype);
  const size_t elem = kernels::DTypeSize(dtype);
  const int64_t row_bytes = int64_t{g.num_query_heads} * g.head_dim * static_cast<int64_t>(elem);
  if (static_cast<int64_t>(p.queries.size()) != n * row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("queries has ", p.queries.size(), " bytes; expected ", n, " tokens x ",
                     g.num_query_heads, " query heads x head_dim ", g.head_dim, " x ", elem,
                     " bytes (", kernels::DTypeName(dtype), ") = ", n * row_bytes));
  }
  return dtype;
}

absl::StatusOr<AttendResult> AttendLocked(Sequence& seq, const AttendParams& p, DType dtype,
                                          int64_t max_response_bytes) {
  const PoolGeometry& g = seq.geometry();
  const int layer = static_cast<int>(p.layer);
  const int64_t appended = seq.layer_tokens(layer);
  for (int32_t position : p.positions) {
    if (position < appended - 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("query position ", position, " is before the last token of layer ", layer,
                       " (position ", appended - 1,
                       "): Attend attends to every stored token, which is decode attention; "
                       "compute attention for earlier positions (prefill) in the engine"));
    }
  }
  SequenceStorage& st = seq.storage();
  std::vector<Part> parts;
  int32_t max_stored = 0;
  int64_t total_stored = 0;
  for (int h = 0; h < g.num_kv_heads; ++h) {
    max_stored = std::max(max_stored, static_cast<int32_t>(st.lane_tokens(layer, h)));
    total_stored += st.lane_tokens(layer, h);
  }
  const int64_t n = static_cast<int64_t>(p.positions.size());
  const int64_t row_bytes =
      int64_t{g.num_query_heads} * g.head_dim * static_cast<int64_t>(kernels::DTypeSize(dtype));
  KVC_RETURN_IF_ERROR(
      CheckResponseSize(p, g, row_bytes, max_stored, total_stored, max_response_bytes));
  for (int t = 0; t < static_cast<int>(st.tiers().size()); ++t) {
    Part part{t, BuildTierLanes(st, layer, t, /*with_positions=*/false), {}};
    if (part.lanes.max_tokens == 0) continue;  // an empty tier weighs nothing
    part.arena = seq.pool()->arena(st.tiers()[static_cast<size_t>(t)].format);
    parts.push_back(std::move(part));
  }
  AttendResult result;
  result.dtype = dtype;
  result.output.resize(static_cast<size_t>(n * row_bytes));
  result.max_stored = max_stored;
  const size_t nq = static_cast<size_t>(g.num_query_heads);
  const size_t step_weights = nq * static_cast<size_t>(max_stored);
  if (p.want_weights) result.weights.resize(static_cast<size_t>(n) * step_weights);
  std::vector<float> q32(nq * static_cast<size_t>(g.head_dim)), out32(q32.size());
  if (parts.size() == 1) {
    // One stage for every query token: the lanes and scores go to a device once, and each
    // token's attention adds to the scores the previous one left (stream order).
    Part& part = parts[0];
    OpStage stage(seq.pool());
    const kernels::LaneTable lanes = stage.In(part.lanes.view());
    float* scores = stage.InOut(part.lanes.scores.data(), part.lanes.scores.size());
    for (int64_t i = 0; i < n; ++i) {
      float* weights =
          p.want_weights ? result.weights.data() + static_cast<size_t>(i) * step_weights : nullptr;
      KVC_RETURN_IF_ERROR(
          AttendOnePart(seq, stage, part, lanes, scores, dtype, p.queries.data() + i * row_bytes,
                        static_cast<size_t>(row_bytes), result.output.data() + i * row_bytes,
                        weights, weights == nullptr ? 0 : step_weights));
    }
    KVC_RETURN_IF_ERROR(stage.Finish());
  }
  for (int64_t i = 0; i < n && parts.size() > 1; ++i) {
    float* weights =
        p.want_weights ? result.weights.data() + static_cast<size_t>(i) * step_weights : nullptr;
    kernels::ConvertElements(p.queries.data() + i * row_bytes, dtype, q32.data(), DType::kF32,
                             q32.size());
    KVC_RETURN_IF_ERROR(AttendMerged(seq, parts, q32.data(), out32.data(), weights, max_stored));
    kernels::ConvertElements(out32.data(), DType::kF32, result.output.data() + i * row_bytes, dtype,
                             out32.size());
  }
  // Every step succeeded: the accumulated scores become the sequence's.
  for (const Part& part : parts) {
    for (int h = 0; h < g.num_kv_heads; ++h) {
      st.SetScores(st.lane_index(layer, h), part.tier, part.lanes.LaneScores(h));
    }
  }
  seq.set_has_scores();
  if (p.want_weights) result.weight_positions = WeightPositions(st, layer, max_stored);
  return result;
}

}  // namespace kvc::cachesvc
