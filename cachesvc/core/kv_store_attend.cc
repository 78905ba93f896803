// KvStore::Attend: decode attention over the stored (possibly evicted and quantized) KV of
// one layer, computed next to the memory by the paged decode-attention kernel. Every call
// adds its attention weights to the tokens' H2O scores.
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/kv_store.h"
#include "cachesvc/core/lane_ops.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

absl::StatusOr<AttendResult> KvStore::Attend(const AttendParams& p) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, FindLive(p.sequence_id));
  BlockPool* pool = seq->pool();
  const PoolGeometry& g = pool->options().geometry;
  if (p.layer < 0 || p.layer >= g.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", p.layer, " is out of range: pool '",
                                                   pool->options().name, "' has ", g.num_layers,
                                                   " layers (0..", g.num_layers - 1, ")"));
  }
  const int64_t n = static_cast<int64_t>(p.positions.size());
  constexpr int64_t kMaxQueries = 4096;
  if (n < 1 || n > kMaxQueries) {
    return absl::InvalidArgumentError(absl::StrCat("positions has ", n, " entries; expected 1..",
                                                   kMaxQueries, " (one per query token)"));
  }
  const size_t elem = kernels::DTypeSize(p.dtype);
  const int64_t row_bytes = int64_t{g.num_query_heads} * g.head_dim * static_cast<int64_t>(elem);
  if (static_cast<int64_t>(p.queries.size()) != n * row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("queries has ", p.queries.size(), " bytes; expected ", n, " tokens x ",
                     g.num_query_heads, " query heads x head_dim ", g.head_dim, " x ", elem,
                     " bytes (", kernels::DTypeName(p.dtype), ") = ", n * row_bytes));
  }
  const int layer = static_cast<int>(p.layer);
  // A writer lock: the kernel adds this step's weights to the stored tokens' scores.
  kvc::WriterMutexLock lock(&seq->mu());
  if (seq->released()) {
    return absl::NotFoundError(absl::StrCat("sequence '", p.sequence_id, "' was released"));
  }
  const int64_t appended = seq->layer_tokens()[static_cast<size_t>(layer)];
  for (int32_t position : p.positions) {
    if (position < appended - 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("query position ", position, " is before the last token of layer ", layer,
                       " (position ", appended - 1,
                       "): Attend attends to every stored token, which is decode attention; "
                       "compute attention for earlier positions (prefill) in the engine"));
    }
  }
  // Attention runs over each part of the lane — the low-bit tokens and the raw residual —
  // and the parts merge exactly by their log-sum-exp (a sequence without a residual has one
  // part). Everything is accumulated in f32 and converted to the caller's dtype at the end.
  const int group = g.num_query_heads / g.num_kv_heads;
  const int d = g.head_dim;
  const size_t nq = static_cast<size_t>(g.num_query_heads);
  const BlockTable* tables[2] = {&seq->table(), &seq->residual()};
  const kernels::PagedArena arenas[2] = {pool->arena(seq->format()),
                                         pool->arena(seq->raw_format())};
  const BlockTable::LaneArrays lanes[2] = {tables[0]->Lanes(layer), tables[1]->Lanes(layer)};
  int32_t max_stored = 0;
  for (int h = 0; h < g.num_kv_heads; ++h)
    max_stored = std::max(max_stored, static_cast<int32_t>(seq->stored_tokens(layer, h)));
  AttendResult result;
  result.output.resize(static_cast<size_t>(n * row_bytes));
  result.max_stored = max_stored;
  const size_t step_weights = nq * static_cast<size_t>(max_stored);
  if (p.want_weights) result.weights.resize(static_cast<size_t>(n) * step_weights);
  std::vector<float> q32(nq * static_cast<size_t>(d)), merged(q32.size());
  std::vector<float> out[2], lse[2], weights[2];
  for (int part = 0; part < 2; ++part) {
    out[part].resize(q32.size());
    lse[part].resize(nq);
    weights[part].resize(nq * static_cast<size_t>(lanes[part].max_tokens));
  }
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    if (lanes[1].max_tokens == 0) {
      // One part (no residual): the kernel writes the output in the caller's dtype and adds
      // the weights to the H2O scores itself; nothing to merge.
      kernels::DecodeAttentionArgs a;
      a.arena = arenas[0];
      a.lanes = lanes[0].view();
      a.group_size = group;
      a.dtype = p.dtype;
      a.queries = p.queries.data() + i * row_bytes;
      a.out = result.output.data() + i * row_bytes;
      a.weights =
          p.want_weights ? result.weights.data() + static_cast<size_t>(i) * step_weights : nullptr;
      a.accumulate_scores = true;
      if (lanes[0].max_tokens > 0) {
        KVC_RETURN_IF_ERROR(
            FromKernelStatus(pool->backend()->DecodeAttention(a, {}), "DecodeAttention"));
      }
      continue;
    }
    kernels::ConvertElements(p.queries.data() + i * row_bytes, p.dtype, q32.data(), DType::kF32,
                             q32.size());
    for (int part = 0; part < 2; ++part) {
      if (lanes[part].max_tokens == 0) {  // nothing in this part: it weighs nothing
        std::fill(lse[part].begin(), lse[part].end(), kNegInf);
        continue;
      }
      kernels::DecodeAttentionArgs a;
      a.arena = arenas[part];
      a.lanes = lanes[part].view();
      a.group_size = group;
      a.dtype = DType::kF32;
      a.queries = q32.data();
      a.out = out[part].data();
      a.weights = weights[part].data();
      a.lse = lse[part].data();
      KVC_RETURN_IF_ERROR(
          FromKernelStatus(pool->backend()->DecodeAttention(a, {}), "DecodeAttention"));
    }
    for (size_t r = 0; r < nq; ++r) {
      const float m = std::max(lse[0][r], lse[1][r]);
      float f[2] = {0.0f, 0.0f};
      if (m != kNegInf) {
        const float total = m + std::log(std::exp(lse[0][r] - m) + std::exp(lse[1][r] - m));
        for (int part = 0; part < 2; ++part) f[part] = std::exp(lse[part][r] - total);
      }
      for (int j = 0; j < d; ++j) {
        const size_t e = r * static_cast<size_t>(d) + static_cast<size_t>(j);
        merged[e] =
            (f[0] != 0.0f ? f[0] * out[0][e] : 0.0f) + (f[1] != 0.0f ? f[1] * out[1][e] : 0.0f);
      }
      for (int part = 0; part < 2; ++part) {
        const size_t stride = static_cast<size_t>(lanes[part].max_tokens);
        for (size_t t = 0; t < stride; ++t) weights[part][r * stride + t] *= f[part];
      }
    }
    kernels::ConvertElements(merged.data(), DType::kF32, result.output.data() + i * row_bytes,
                             p.dtype, merged.size());
    // H2O: every token's score grows by its weight in the merged softmax.
    for (int part = 0; part < 2; ++part) {
      if (lanes[part].max_tokens == 0) continue;
      kernels::AccumulateScoresArgs acc;
      acc.arena = arenas[part];
      acc.lanes = lanes[part].view();
      acc.group_size = group;
      acc.weights = weights[part].data();
      KVC_RETURN_IF_ERROR(
          FromKernelStatus(pool->backend()->AccumulateScores(acc, {}), "AccumulateScores"));
    }
    if (p.want_weights) {
      float* dst = result.weights.data() + static_cast<size_t>(i) * step_weights;
      for (size_t r = 0; r < nq; ++r) {
        const int h = static_cast<int>(r) / group;
        size_t at = 0;
        for (int part = 0; part < 2; ++part) {
          const size_t stride = static_cast<size_t>(lanes[part].max_tokens);
          const size_t count = static_cast<size_t>(lanes[part].num_tokens[h]);
          std::copy_n(weights[part].begin() + static_cast<std::ptrdiff_t>(r * stride), count,
                      dst + r * static_cast<size_t>(max_stored) + at);
          at += count;
        }
      }
    }
  }
  seq->set_has_scores();
  if (p.want_weights) {
    result.weight_positions.assign(
        static_cast<size_t>(g.num_kv_heads) * static_cast<size_t>(max_stored), -1);
    for (int h = 0; h < g.num_kv_heads; ++h) {
      size_t at = static_cast<size_t>(h) * static_cast<size_t>(max_stored);
      for (int part = 0; part < 2; ++part) {
        for (int32_t pos : LanePositions(pool, part == 0 ? seq->format() : seq->raw_format(),
                                         *tables[part], layer, h)) {
          result.weight_positions[at++] = pos;
        }
      }
    }
  }
  return result;
}

}  // namespace kvc::cachesvc
