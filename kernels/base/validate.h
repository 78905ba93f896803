// Argument checks shared by every backend. The scalar checks (shapes, dtypes, null
// pointers) run on the host for all backends; the content checks (block ids, slots, lane
// offsets, token counts) read the index arrays and so run only where those live in host
// memory.
//
// An op that returns an error has written nothing (ops.h): host backends run every check of
// an op (CheckHost, host_backend.h) before its first write; the CUDA backend runs the scalar
// checks here, then its own limits and scratch allocations, before it enqueues the first
// kernel that writes caller memory. Preconditions that cost a pass over the whole arena
// (distinct destinations, non-overlapping gather sides) are the caller's to keep and are
// not checked.
#pragma once

#include "kvc/kernels/ops.h"
#include "kvc/kernels/status.h"

namespace kvc::kernels::internal {

KernelStatus CheckArena(const PagedArena& arena);
KernelStatus CheckLanesScalar(const LaneTable& lanes);

KernelStatus CheckWrite(const WriteTokensArgs& a);
KernelStatus CheckRead(const ReadTokensArgs& a);
KernelStatus CheckReadRecords(const ReadRecordsArgs& a);
KernelStatus CheckGather(const GatherArgs& a);
KernelStatus CheckRerotate(const RerotateArgs& a);
KernelStatus CheckSnapKv(const SnapKvScoreArgs& a);
KernelStatus CheckExpectedAttention(const ExpectedAttentionScoreArgs& a);
KernelStatus CheckAccumulate(const AccumulateScoresArgs& a);
KernelStatus CheckSelect(const SelectArgs& a);
KernelStatus CheckAllocateBudgets(const AllocateBudgetsArgs& a);
KernelStatus CheckChecksumBlocks(const ChecksumBlocksArgs& a);
KernelStatus CheckDecode(const DecodeAttentionArgs& a);

// Host-memory content checks.
KernelStatus CheckLaneContents(const PagedArena& arena, const LaneTable& lanes);
// Every num_tokens[l] in [0, max_tokens] (the metadata-only ops).
KernelStatus CheckTokenCounts(int32_t num_lanes, const int32_t* num_tokens, int32_t max_tokens);
KernelStatus CheckRowContents(const PagedArena& arena, int32_t n, const int32_t* blocks,
                              const int32_t* slots);

inline int64_t RowStride(int64_t row_stride, int head_dim) {
  return row_stride == 0 ? head_dim : row_stride;
}

}  // namespace kvc::kernels::internal
