// Memory and stream plumbing shared by the host backends (reference and CPU): arenas and
// index arrays are ordinary 64-byte aligned host memory and every op is synchronous.
#pragma once

#include "kvc/kernels/backend.h"

namespace kvc::kernels::internal {

class HostBackend : public KernelBackend {
 public:
  KernelStatus Allocate(size_t bytes, void** out) override;
  void Free(void* ptr) override;
  KernelStatus CopyToDevice(void* dst, const void* src, size_t bytes, StreamHandle) override;
  KernelStatus CopyToHost(void* dst, const void* src, size_t bytes, StreamHandle) override;
  KernelStatus CopyOnDevice(void* dst, const void* src, size_t bytes, StreamHandle) override;
  KernelStatus Memset(void* dst, int value, size_t bytes, StreamHandle) override;
  KernelStatus Synchronize(StreamHandle) override { return KernelStatus::Ok(); }
};

// Full validation (scalar and contents) for host backends; each op calls one of these before
// it writes anything, so an op that returns an error has written nothing.
KernelStatus CheckHost(const WriteTokensArgs& a);
KernelStatus CheckHost(const ReadTokensArgs& a);
KernelStatus CheckHost(const ReadRecordsArgs& a);
KernelStatus CheckHost(const GatherArgs& a);
KernelStatus CheckHost(const RerotateArgs& a);
KernelStatus CheckHost(const SnapKvScoreArgs& a);
KernelStatus CheckHost(const ExpectedAttentionScoreArgs& a);
KernelStatus CheckHost(const AccumulateScoresArgs& a);
KernelStatus CheckHost(const SelectArgs& a);
KernelStatus CheckHost(const AllocateBudgetsArgs& a);
KernelStatus CheckHost(const DecodeAttentionArgs& a);
KernelStatus CheckHost(const ChecksumBlocksArgs& a);

}  // namespace kvc::kernels::internal
