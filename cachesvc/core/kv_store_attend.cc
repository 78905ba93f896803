// KvStore::Attend: decode attention over the stored (possibly evicted and quantized) KV of
// one layer, computed next to the memory by the paged decode-attention kernel. Every call
// adds its attention weights to the tokens' H2O scores.
#include "absl/strings/str_cat.h"
#include "cachesvc/core/kv_store.h"
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
  const BlockTable::LaneArrays lanes = seq->table().Lanes(layer);
  const StorageFormat format = seq->format();
  const kernels::PagedArena arena = pool->arena(format);
  const int group = g.num_query_heads / g.num_kv_heads;
  AttendResult result;
  result.output.resize(static_cast<size_t>(n * row_bytes));
  result.max_stored = lanes.max_tokens;
  const size_t step_weights =
      static_cast<size_t>(g.num_query_heads) * static_cast<size_t>(lanes.max_tokens);
  if (p.want_weights) result.weights.resize(static_cast<size_t>(n) * step_weights);
  // Nothing stored for this layer yet: attention over nothing is zeros (as the kernel
  // defines it for an empty lane).
  for (int64_t i = 0; i < n && lanes.max_tokens > 0; ++i) {
    kernels::DecodeAttentionArgs a;
    a.arena = arena;
    a.lanes = lanes.view();
    a.group_size = group;
    a.dtype = p.dtype;
    a.queries = p.queries.data() + i * row_bytes;
    a.out = result.output.data() + i * row_bytes;
    a.weights =
        p.want_weights ? result.weights.data() + static_cast<size_t>(i) * step_weights : nullptr;
    a.accumulate_scores = true;
    KVC_RETURN_IF_ERROR(
        FromKernelStatus(pool->backend()->DecodeAttention(a, {}), "DecodeAttention"));
  }
  seq->set_has_scores();
  if (p.want_weights) {
    result.weight_positions.assign(
        static_cast<size_t>(g.num_kv_heads) * static_cast<size_t>(lanes.max_tokens), -1);
    std::vector<TokenSlot> slots;
    for (int h = 0; h < g.num_kv_heads; ++h) {
      const HeadBlocks& head = seq->table().head(layer, h);
      seq->table().Slots(layer, h, 0, head.tokens, &slots);
      for (size_t t = 0; t < slots.size(); ++t) {
        result
            .weight_positions[static_cast<size_t>(h) * static_cast<size_t>(lanes.max_tokens) + t] =
            *kernels::PositionPtr(arena, slots[t].block, slots[t].slot);
      }
    }
  }
  return result;
}

}  // namespace kvc::cachesvc
