// Argument checks shared by every backend. The scalar checks (shapes, dtypes, null
// pointers) run on the host for all backends; the content checks (block ids, slots, lane
// offsets) read the index arrays and so run only where those live in host memory.
#pragma once

#include "kvc/kernels/ops.h"
#include "kvc/kernels/status.h"

namespace kvc::kernels::internal {

KernelStatus CheckArena(const PagedArena& arena);
KernelStatus CheckLanesScalar(const LaneTable& lanes);

KernelStatus CheckWrite(const WriteTokensArgs& a);
KernelStatus CheckRead(const ReadTokensArgs& a);
KernelStatus CheckGather(const GatherArgs& a);
KernelStatus CheckRerotate(const RerotateArgs& a);
KernelStatus CheckSnapKv(const SnapKvScoreArgs& a);
KernelStatus CheckAccumulate(const AccumulateScoresArgs& a);
KernelStatus CheckSelect(const SelectArgs& a);
KernelStatus CheckCompact(const CompactArgs& a);
KernelStatus CheckDecode(const DecodeAttentionArgs& a);

// Host-memory content checks.
KernelStatus CheckLaneContents(const PagedArena& arena, const LaneTable& lanes);
KernelStatus CheckRowContents(const PagedArena& arena, int32_t n, const int32_t* blocks,
                              const int32_t* slots);

inline int64_t RowStride(int64_t row_stride, int head_dim) {
  return row_stride == 0 ? head_dim : row_stride;
}

}  // namespace kvc::kernels::internal
