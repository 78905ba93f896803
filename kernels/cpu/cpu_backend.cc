// The CPU backend: validation, then the threaded ops over one ThreadPool per backend.
#include <memory>

#include "base/host_backend.h"
#include "cpu/cpu_ops.h"

namespace kvc::kernels {
namespace {

class CpuBackend final : public internal::HostBackend {
 public:
  explicit CpuBackend(int threads) : pool_(threads) {}
  BackendKind kind() const override { return BackendKind::kCpu; }
  const char* name() const override { return "cpu"; }

#define KVC_CPU_OP(Name, Args)                              \
  KernelStatus Name(const Args& a, StreamHandle) override { \
    KVC_KERNEL_RETURN_IF_ERROR(internal::CheckHost(a));     \
    cpu::Name(pool_, a);                                    \
    return KernelStatus::Ok();                              \
  }
  KVC_CPU_OP(WriteTokens, WriteTokensArgs)
  KVC_CPU_OP(ReadTokens, ReadTokensArgs)
  KVC_CPU_OP(ReadRecords, ReadRecordsArgs)
  KVC_CPU_OP(Gather, GatherArgs)
  KVC_CPU_OP(Rerotate, RerotateArgs)
  KVC_CPU_OP(ChecksumBlocks, ChecksumBlocksArgs)
  KVC_CPU_OP(SnapKvScore, SnapKvScoreArgs)
  KVC_CPU_OP(ExpectedAttentionScore, ExpectedAttentionScoreArgs)
  KVC_CPU_OP(AccumulateScores, AccumulateScoresArgs)
  KVC_CPU_OP(Select, SelectArgs)
  KVC_CPU_OP(AllocateBudgets, AllocateBudgetsArgs)
  KVC_CPU_OP(DecodeAttention, DecodeAttentionArgs)
#undef KVC_CPU_OP

 private:
  ThreadPool pool_;  // shared by concurrent callers (see kvc/kernels/thread_pool.h)
};

}  // namespace

namespace internal {
std::unique_ptr<KernelBackend> MakeCpuBackend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);  // <= 0: hardware concurrency
}
}  // namespace internal

}  // namespace kvc::kernels
