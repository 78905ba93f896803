#include "base/host_backend.h"

#include <cstdlib>
#include <cstring>

#include "base/validate.h"

namespace kvc::kernels::internal {

KernelStatus HostBackend::Allocate(size_t bytes, void** out) {
  *out = nullptr;
  if (bytes == 0) return KernelStatus::Ok();
  void* p = std::aligned_alloc(64, AlignUp(bytes, 64));
  if (p == nullptr) return KernelStatus{KernelStatusCode::kOutOfMemory, "host allocation failed"};
  *out = p;
  return KernelStatus::Ok();
}

void HostBackend::Free(void* ptr) { std::free(ptr); }

KernelStatus HostBackend::CopyToDevice(void* dst, const void* src, size_t bytes, StreamHandle) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return KernelStatus::Ok();
}
KernelStatus HostBackend::CopyToHost(void* dst, const void* src, size_t bytes, StreamHandle) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return KernelStatus::Ok();
}
KernelStatus HostBackend::CopyOnDevice(void* dst, const void* src, size_t bytes, StreamHandle) {
  if (bytes > 0) std::memmove(dst, src, bytes);
  return KernelStatus::Ok();
}
KernelStatus HostBackend::Memset(void* dst, int value, size_t bytes, StreamHandle) {
  if (bytes > 0) std::memset(dst, value, bytes);
  return KernelStatus::Ok();
}

KernelStatus CheckHost(const WriteTokensArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckWrite(a));
  return CheckRowContents(a.arena, a.num_rows, a.dst_blocks, a.dst_slots);
}
KernelStatus CheckHost(const ReadTokensArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckRead(a));
  return CheckRowContents(a.arena, a.num_rows, a.src_blocks, a.src_slots);
}
KernelStatus CheckHost(const ReadRecordsArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckReadRecords(a));
  return CheckRowContents(a.arena, a.num_rows, a.src_blocks, a.src_slots);
}
KernelStatus CheckHost(const GatherArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckGather(a));
  KVC_KERNEL_RETURN_IF_ERROR(CheckRowContents(a.src, a.num_rows, a.src_blocks, a.src_slots));
  return CheckRowContents(a.dst, a.num_rows, a.dst_blocks, a.dst_slots);
}
KernelStatus CheckHost(const RerotateArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckRerotate(a));
  return CheckRowContents(a.arena, a.num_rows, a.blocks, a.slots);
}
KernelStatus CheckHost(const SnapKvScoreArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckSnapKv(a));
  return CheckLaneContents(a.arena, a.lanes);
}
KernelStatus CheckHost(const ExpectedAttentionScoreArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckExpectedAttention(a));
  return CheckLaneContents(a.arena, a.lanes);
}
KernelStatus CheckHost(const AccumulateScoresArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckAccumulate(a));
  return CheckTokenCounts(a.num_lanes, a.num_tokens, a.max_tokens);
}
KernelStatus CheckHost(const SelectArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckSelect(a));
  return CheckTokenCounts(a.num_lanes, a.num_tokens, a.max_tokens);
}
KernelStatus CheckHost(const AllocateBudgetsArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckAllocateBudgets(a));
  return CheckTokenCounts(a.num_lanes, a.num_tokens, a.max_tokens);
}
KernelStatus CheckHost(const DecodeAttentionArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckDecode(a));
  return CheckLaneContents(a.arena, a.lanes);
}
KernelStatus CheckHost(const ChecksumBlocksArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(CheckChecksumBlocks(a));
  for (int32_t i = 0; i < a.num_blocks; ++i) {
    if (a.blocks[i] < 0 || a.blocks[i] >= a.arena.num_blocks)
      return KernelStatus::Invalid("block id out of range");
  }
  return KernelStatus::Ok();
}

}  // namespace kvc::kernels::internal
