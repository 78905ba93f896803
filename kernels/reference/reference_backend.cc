// The reference backend: validation, then the scalar specification ops.
#include <memory>

#include "base/host_backend.h"
#include "reference/reference_ops.h"

namespace kvc::kernels {
namespace {

class ReferenceBackend final : public internal::HostBackend {
 public:
  BackendKind kind() const override { return BackendKind::kReference; }
  const char* name() const override { return "reference"; }

#define KVC_REF_OP(Name, Args)                              \
  KernelStatus Name(const Args& a, StreamHandle) override { \
    KVC_KERNEL_RETURN_IF_ERROR(internal::CheckHost(a));     \
    reference::Name(a);                                     \
    return KernelStatus::Ok();                              \
  }
  KVC_REF_OP(WriteTokens, WriteTokensArgs)
  KVC_REF_OP(ReadTokens, ReadTokensArgs)
  KVC_REF_OP(ReadRecords, ReadRecordsArgs)
  KVC_REF_OP(Gather, GatherArgs)
  KVC_REF_OP(Rerotate, RerotateArgs)
  KVC_REF_OP(ChecksumBlocks, ChecksumBlocksArgs)
  KVC_REF_OP(SnapKvScore, SnapKvScoreArgs)
  KVC_REF_OP(ExpectedAttentionScore, ExpectedAttentionScoreArgs)
  KVC_REF_OP(AccumulateScores, AccumulateScoresArgs)
  KVC_REF_OP(Select, SelectArgs)
  KVC_REF_OP(AllocateBudgets, AllocateBudgetsArgs)
  KVC_REF_OP(DecodeAttention, DecodeAttentionArgs)
#undef KVC_REF_OP
};

}  // namespace

namespace internal {
std::unique_ptr<KernelBackend> MakeReferenceBackend() {
  return std::make_unique<ReferenceBackend>();
}
}  // namespace internal

}  // namespace kvc::kernels
