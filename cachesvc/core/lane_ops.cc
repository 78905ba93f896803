#include "cachesvc/core/lane_ops.h"

#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

absl::Status WriteLaneRows(BlockPool* pool, StorageFormat format, const BlockTable& table,
                           int layer, int kv_head, int64_t first, int64_t n, DType dtype,
                           const void* keys, const void* values, int64_t row_stride,
                           const int32_t* positions, const float* scores) {
  if (n == 0) return absl::OkStatus();
  std::vector<TokenSlot> slots;
  table.Slots(layer, kv_head, first, n, &slots);
  std::vector<int32_t> blocks(static_cast<size_t>(n)), slot_ids(static_cast<size_t>(n));
  for (size_t t = 0; t < slots.size(); ++t) {
    blocks[t] = slots[t].block;
    slot_ids[t] = slots[t].slot;
  }
  kernels::WriteTokensArgs w;
  w.arena = pool->arena(format);
  w.num_rows = static_cast<int32_t>(n);
  w.dtype = dtype;
  w.keys = keys;
  w.values = values;
  w.row_stride = row_stride;
  w.positions = positions;
  w.dst_blocks = blocks.data();
  w.dst_slots = slot_ids.data();
  KVC_RETURN_IF_ERROR(FromKernelStatus(pool->backend()->WriteTokens(w, {}), "WriteTokens"));
  if (scores != nullptr) {
    for (size_t t = 0; t < slots.size(); ++t)
      *kernels::ScorePtr(w.arena, blocks[t], slot_ids[t]) = scores[t];
  }
  return absl::OkStatus();
}

absl::Status AppendLaneRows(BlockPool* pool, StorageFormat format, BlockTable& table, int layer,
                            int kv_head, const LaneRows& rows, std::vector<BlockId>* fresh) {
  HeadBlocks& head = table.head(layer, kv_head);
  const int64_t grow = table.BlocksToGrow(head.tokens, rows.size());
  KVC_CHECK(static_cast<int64_t>(fresh->size()) >= grow) << fresh->size() << " < " << grow;
  head.blocks.insert(head.blocks.end(), fresh->end() - grow, fresh->end());
  fresh->resize(fresh->size() - static_cast<size_t>(grow));
  const int64_t first = head.tokens;
  head.tokens += rows.size();
  return WriteLaneRows(pool, format, table, layer, kv_head, first, rows.size(), DType::kF32,
                       rows.keys.data(), rows.values.data(), 0, rows.positions.data(),
                       rows.scores.data());
}

absl::StatusOr<LaneRows> ReadLaneRows(BlockPool* pool, StorageFormat format,
                                      const BlockTable& table, int layer, int kv_head,
                                      const std::vector<int64_t>& indices) {
  const int d = pool->options().geometry.head_dim;
  const int bt = table.block_tokens();
  const HeadBlocks& head = table.head(layer, kv_head);
  const size_t n = indices.size();
  LaneRows rows;
  rows.keys.resize(n * static_cast<size_t>(d));
  rows.values.resize(rows.keys.size());
  rows.scores.resize(n);
  rows.positions.resize(n);
  if (n == 0) return rows;
  std::vector<int32_t> blocks(n), slots(n);
  for (size_t t = 0; t < n; ++t) {
    blocks[t] = head.blocks[static_cast<size_t>(indices[t] / bt)];
    slots[t] = static_cast<int32_t>(indices[t] % bt);
  }
  kernels::ReadTokensArgs r;
  r.arena = pool->arena(format);
  r.num_rows = static_cast<int32_t>(n);
  r.dtype = DType::kF32;
  r.keys = rows.keys.data();
  r.values = rows.values.data();
  r.positions = rows.positions.data();
  r.scores = rows.scores.data();
  r.src_blocks = blocks.data();
  r.src_slots = slots.data();
  KVC_RETURN_IF_ERROR(FromKernelStatus(pool->backend()->ReadTokens(r, {}), "ReadTokens"));
  return rows;
}

std::vector<int32_t> LanePositions(BlockPool* pool, StorageFormat format, const BlockTable& table,
                                   int layer, int kv_head) {
  const HeadBlocks& head = table.head(layer, kv_head);
  const kernels::PagedArena arena = pool->arena(format);
  std::vector<int32_t> positions(static_cast<size_t>(head.tokens));
  const int bt = table.block_tokens();
  for (int64_t i = 0; i < head.tokens; ++i) {
    positions[static_cast<size_t>(i)] = *kernels::PositionPtr(
        arena, head.blocks[static_cast<size_t>(i / bt)], static_cast<int32_t>(i % bt));
  }
  return positions;
}

absl::StatusOr<int64_t> CompactLayer(BlockPool* pool, StorageFormat format, BlockTable& table,
                                     int layer, const std::vector<uint8_t>& keep, size_t stride) {
  const BlockTable::LaneArrays lanes = table.Lanes(layer);
  const int num_lanes = table.num_kv_heads();
  if (lanes.max_tokens == 0) return 0;
  KVC_CHECK(stride >= static_cast<size_t>(lanes.max_tokens) &&
            keep.size() >= stride * static_cast<size_t>(num_lanes));
  // The kernel reads keep with a row stride of lanes.max_tokens.
  std::vector<uint8_t> packed(static_cast<size_t>(num_lanes) *
                              static_cast<size_t>(lanes.max_tokens));
  for (int h = 0; h < num_lanes; ++h) {
    std::copy_n(keep.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(h) * stride),
                lanes.max_tokens,
                packed.begin() + static_cast<std::ptrdiff_t>(h) * lanes.max_tokens);
  }
  std::vector<int32_t> new_tokens(static_cast<size_t>(num_lanes)),
      new_blocks(static_cast<size_t>(num_lanes));
  kernels::CompactArgs compact;
  compact.arena = pool->arena(format);
  compact.lanes = lanes.view();
  compact.keep = packed.data();
  compact.new_num_tokens = new_tokens.data();
  compact.new_num_blocks = new_blocks.data();
  KVC_RETURN_IF_ERROR(FromKernelStatus(pool->backend()->Compact(compact, {}), "Compact"));
  int64_t removed = 0;
  std::vector<BlockId> freed;
  for (int h = 0; h < num_lanes; ++h) {
    HeadBlocks& head = table.head(layer, h);
    removed += head.tokens - new_tokens[static_cast<size_t>(h)];
    head.tokens = new_tokens[static_cast<size_t>(h)];
    const size_t keep_blocks = static_cast<size_t>(new_blocks[static_cast<size_t>(h)]);
    freed.insert(freed.end(), head.blocks.begin() + static_cast<std::ptrdiff_t>(keep_blocks),
                 head.blocks.end());
    head.blocks.resize(keep_blocks);
  }
  pool->Free(format, freed);
  return removed;
}

}  // namespace kvc::cachesvc
