#include "base/validate.h"

#include <cstdint>

#include "kvc/kernels/record_codec.h"

namespace kvc::kernels::internal {

KernelStatus CheckArena(const PagedArena& arena) {
  const BlockLayout& l = arena.layout;
  if (arena.base == nullptr && arena.num_blocks > 0)
    return KernelStatus::Invalid("arena base is null");
  if (arena.num_blocks < 0) return KernelStatus::Invalid("arena num_blocks < 0");
  if (static_cast<int>(l.format) >= kNumStorageFormats) {
    return KernelStatus::Invalid("unknown storage format");
  }
  if (!FormatSupportsHeadDim(l.format, l.head_dim) || l.head_dim > kMaxHeadDim) {
    return KernelStatus::Unsupported(
        "head_dim must be a multiple of 16 (and of the format's group), at most 512");
  }
  if (l.block_tokens <= 0) return KernelStatus::Invalid("block_tokens must be positive");
  const BlockLayout expect = MakeBlockLayout(l.format, l.head_dim, l.block_tokens);
  if (expect.record_bytes != l.record_bytes || expect.key_offset != l.key_offset ||
      expect.value_offset != l.value_offset || expect.block_bytes != l.block_bytes) {
    return KernelStatus::Invalid("block layout does not match MakeBlockLayout");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckLanesScalar(const LaneTable& lanes) {
  if (lanes.num_lanes < 0 || lanes.max_tokens < 0) {
    return KernelStatus::Invalid("num_lanes and max_tokens must be >= 0");
  }
  if (lanes.num_lanes > 0 && (lanes.block_offsets == nullptr || lanes.block_ids == nullptr ||
                              lanes.num_tokens == nullptr)) {
    return KernelStatus::Invalid("lane table pointers must be set");
  }
  return KernelStatus::Ok();
}

static bool ValidDType(DType d) { return static_cast<int>(d) <= static_cast<int>(DType::kBF16); }

static KernelStatus CheckRowsScalar(int32_t n, const void* a, const void* b) {
  if (n < 0) return KernelStatus::Invalid("num_rows < 0");
  if (n > 0 && (a == nullptr || b == nullptr))
    return KernelStatus::Invalid("row index arrays must be set");
  return KernelStatus::Ok();
}

KernelStatus CheckWrite(const WriteTokensArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckArena(a.arena));
  KVC_KERNEL_RETURN_IF_ERROR(CheckRowsScalar(a.num_rows, a.dst_blocks, a.dst_slots));
  if (!ValidDType(a.dtype)) return KernelStatus::Invalid("unknown dtype");
  if (a.num_rows > 0 && (a.keys == nullptr || a.values == nullptr)) {
    return KernelStatus::Invalid("keys and values must be set");
  }
  if (a.row_stride != 0 && a.row_stride < a.arena.layout.head_dim) {
    return KernelStatus::Invalid("row_stride < head_dim");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckRead(const ReadTokensArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckArena(a.arena));
  KVC_KERNEL_RETURN_IF_ERROR(CheckRowsScalar(a.num_rows, a.src_blocks, a.src_slots));
  if (!ValidDType(a.dtype)) return KernelStatus::Invalid("unknown dtype");
  if (a.row_stride != 0 && a.row_stride < a.arena.layout.head_dim) {
    return KernelStatus::Invalid("row_stride < head_dim");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckReadRecords(const ReadRecordsArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckArena(a.arena));
  KVC_KERNEL_RETURN_IF_ERROR(CheckRowsScalar(a.num_rows, a.src_blocks, a.src_slots));
  // Records are 4-byte multiples holding f32 scales; the CUDA backend copies 4-byte words.
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; };
  if (!aligned(a.keys) || !aligned(a.values))
    return KernelStatus::Invalid("record outputs must be 4-byte aligned");
  return KernelStatus::Ok();
}

KernelStatus CheckGather(const GatherArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckArena(a.src));
  KVC_KERNEL_RETURN_IF_ERROR(CheckArena(a.dst));
  KVC_KERNEL_RETURN_IF_ERROR(CheckRowsScalar(a.num_rows, a.src_blocks, a.src_slots));
  KVC_KERNEL_RETURN_IF_ERROR(CheckRowsScalar(a.num_rows, a.dst_blocks, a.dst_slots));
  if (a.src.layout.format != a.dst.layout.format ||
      a.src.layout.head_dim != a.dst.layout.head_dim) {
    return KernelStatus::Invalid("gather needs the same format and head_dim on both sides");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckRerotate(const RerotateArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckArena(a.arena));
  KVC_KERNEL_RETURN_IF_ERROR(CheckRowsScalar(a.num_rows, a.blocks, a.slots));
  if (a.num_rows > 0 && a.deltas == nullptr) return KernelStatus::Invalid("deltas must be set");
  const int rd = a.rope.rotary_dim == 0 ? a.arena.layout.head_dim : a.rope.rotary_dim;
  if (rd <= 0 || rd % 2 != 0 || rd > a.arena.layout.head_dim) {
    return KernelStatus::Invalid("rotary_dim must be even and in (0, head_dim]");
  }
  if (!(a.rope.theta > 0)) return KernelStatus::Invalid("rope theta must be positive");
  return KernelStatus::Ok();
}

KernelStatus CheckSnapKv(const SnapKvScoreArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckArena(a.arena));
  KVC_KERNEL_RETURN_IF_ERROR(CheckLanesScalar(a.lanes));
  if (a.group_size <= 0 || a.window <= 0)
    return KernelStatus::Invalid("group_size and window must be positive");
  if (a.pool_kernel <= 0 || a.pool_kernel % 2 == 0)
    return KernelStatus::Invalid("pool_kernel must be odd");
  if (!ValidDType(a.query_dtype)) return KernelStatus::Invalid("unknown dtype");
  if (a.lanes.num_lanes > 0 && (a.queries == nullptr || a.query_positions == nullptr ||
                                a.key_positions == nullptr || a.scores == nullptr)) {
    return KernelStatus::Invalid("queries, query_positions, key_positions and scores must be set");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckExpectedAttention(const ExpectedAttentionScoreArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckArena(a.arena));
  KVC_KERNEL_RETURN_IF_ERROR(CheckLanesScalar(a.lanes));
  if (a.group_size <= 0) return KernelStatus::Invalid("group_size must be positive");
  if (a.min_position < 0) return KernelStatus::Invalid("min_position must be >= 0");
  if (a.lanes.num_lanes > 0 &&
      (a.mean == nullptr || a.key_positions == nullptr || a.scores == nullptr)) {
    return KernelStatus::Invalid("mean, key_positions and scores must be set");
  }
  return KernelStatus::Ok();
}

// The metadata-only ops (no arena, no block lists): per-lane token counts and a row stride.
static KernelStatus CheckTokenRows(int32_t num_lanes, const int32_t* num_tokens,
                                   int32_t max_tokens) {
  if (num_lanes < 0 || max_tokens < 0) {
    return KernelStatus::Invalid("num_lanes and max_tokens must be >= 0");
  }
  if (num_lanes > 0 && num_tokens == nullptr)
    return KernelStatus::Invalid("num_tokens must be set");
  return KernelStatus::Ok();
}

KernelStatus CheckAccumulate(const AccumulateScoresArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckTokenRows(a.num_lanes, a.num_tokens, a.max_tokens));
  if (a.group_size <= 0) return KernelStatus::Invalid("group_size must be positive");
  if (a.num_lanes > 0 && (a.weights == nullptr || a.scores == nullptr))
    return KernelStatus::Invalid("weights and scores must be set");
  return KernelStatus::Ok();
}

KernelStatus CheckSelect(const SelectArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckTokenRows(a.num_lanes, a.num_tokens, a.max_tokens));
  if (a.sinks < 0 || a.recent < 0 || a.budget < 0)
    return KernelStatus::Invalid("sinks, recent and budget must be >= 0");
  if (a.num_lanes > 0 && (a.positions == nullptr || a.scores == nullptr || a.keep == nullptr))
    return KernelStatus::Invalid("positions, scores and keep must be set");
  return KernelStatus::Ok();
}

KernelStatus CheckAllocateBudgets(const AllocateBudgetsArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckTokenRows(a.num_lanes, a.num_tokens, a.max_tokens));
  if (a.sinks < 0 || a.recent < 0 || a.floor < 0)
    return KernelStatus::Invalid("sinks, recent and floor must be >= 0");
  if (a.group_lanes < 1 || a.num_lanes % a.group_lanes != 0)
    return KernelStatus::Invalid("group_lanes must be >= 1 and divide num_lanes");
  if (a.num_lanes > 0 && (a.positions == nullptr || a.scores == nullptr || a.totals == nullptr ||
                          a.budgets == nullptr))
    return KernelStatus::Invalid("positions, scores, totals and budgets must be set");
  return KernelStatus::Ok();
}

KernelStatus CheckChecksumBlocks(const ChecksumBlocksArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckArena(a.arena));
  if (a.num_blocks < 0) return KernelStatus::Invalid("num_blocks must be >= 0");
  if (a.num_blocks > 0 && (a.blocks == nullptr || a.checksums == nullptr))
    return KernelStatus::Invalid("blocks and checksums must be set");
  return KernelStatus::Ok();
}

KernelStatus CheckDecode(const DecodeAttentionArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckArena(a.arena));
  KVC_KERNEL_RETURN_IF_ERROR(CheckLanesScalar(a.lanes));
  if (a.group_size <= 0 || a.group_size > 64)
    return KernelStatus::Invalid("group_size must be in [1, 64]");
  if (!ValidDType(a.dtype)) return KernelStatus::Invalid("unknown dtype");
  if (a.lanes.num_lanes > 0 && (a.queries == nullptr || a.out == nullptr)) {
    return KernelStatus::Invalid("queries and out must be set");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckLaneContents(const PagedArena& arena, const LaneTable& lanes) {
  if (lanes.num_lanes == 0) return KernelStatus::Ok();
  if (lanes.block_offsets[0] != 0) return KernelStatus::Invalid("block_offsets[0] must be 0");
  for (int32_t l = 0; l < lanes.num_lanes; ++l) {
    const int32_t b0 = lanes.block_offsets[l], b1 = lanes.block_offsets[l + 1];
    if (b1 < b0) return KernelStatus::Invalid("block_offsets must be nondecreasing");
    const int64_t n = lanes.num_tokens[l];
    if (n < 0 || n > static_cast<int64_t>(b1 - b0) * arena.layout.block_tokens) {
      return KernelStatus::Invalid("lane num_tokens exceeds its blocks");
    }
    if (n > lanes.max_tokens) return KernelStatus::Invalid("lane num_tokens exceeds max_tokens");
    for (int32_t i = b0; i < b1; ++i) {
      if (lanes.block_ids[i] < 0 || lanes.block_ids[i] >= arena.num_blocks) {
        return KernelStatus::Invalid("block id out of range");
      }
    }
  }
  return KernelStatus::Ok();
}

KernelStatus CheckTokenCounts(int32_t num_lanes, const int32_t* num_tokens, int32_t max_tokens) {
  for (int32_t l = 0; l < num_lanes; ++l) {
    if (num_tokens[l] < 0 || num_tokens[l] > max_tokens)
      return KernelStatus::Invalid("num_tokens must be in [0, max_tokens]");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckRowContents(const PagedArena& arena, int32_t n, const int32_t* blocks,
                              const int32_t* slots) {
  for (int32_t r = 0; r < n; ++r) {
    if (blocks[r] < 0 || blocks[r] >= arena.num_blocks)
      return KernelStatus::Invalid("block id out of range");
    if (slots[r] < 0 || slots[r] >= arena.layout.block_tokens)
      return KernelStatus::Invalid("slot out of range");
  }
  return KernelStatus::Ok();
}

}  // namespace kvc::kernels::internal
