// ForwardingBackend: a KernelBackend that passes every call to the backend it wraps. Test
// backends (fault injection, call counting) derive from it and override only what they watch,
// so a new KernelBackend method reaches the real backend everywhere.
#pragma once

#include <memory>
#include <utility>

#include "kvc/kernels/backend.h"

namespace kvc::testing {

class ForwardingBackend : public kernels::KernelBackend {
 public:
  explicit ForwardingBackend(std::unique_ptr<kernels::KernelBackend> inner)
      : inner_(std::move(inner)) {}

  kernels::BackendKind kind() const override { return inner_->kind(); }
  const char* name() const override { return inner_->name(); }
  kernels::KernelStatus Allocate(size_t bytes, void** out) override {
    return inner_->Allocate(bytes, out);
  }
  void Free(void* p) override { inner_->Free(p); }
  kernels::KernelStatus CopyToDevice(void* d, const void* s, size_t n,
                                     kernels::StreamHandle h) override {
    return inner_->CopyToDevice(d, s, n, h);
  }
  kernels::KernelStatus CopyToHost(void* d, const void* s, size_t n,
                                   kernels::StreamHandle h) override {
    return inner_->CopyToHost(d, s, n, h);
  }
  kernels::KernelStatus CopyOnDevice(void* d, const void* s, size_t n,
                                     kernels::StreamHandle h) override {
    return inner_->CopyOnDevice(d, s, n, h);
  }
  kernels::KernelStatus Memset(void* d, int v, size_t n, kernels::StreamHandle h) override {
    return inner_->Memset(d, v, n, h);
  }
  kernels::KernelStatus Synchronize(kernels::StreamHandle h) override {
    return inner_->Synchronize(h);
  }
  kernels::KernelStatus CreateStream(kernels::StreamHandle* out) override {
    return inner_->CreateStream(out);
  }
  void DestroyStream(kernels::StreamHandle h) override { inner_->DestroyStream(h); }
  kernels::KernelStatus AllocateHost(size_t bytes, void** out) override {
    return inner_->AllocateHost(bytes, out);
  }
  void FreeHost(void* p) override { inner_->FreeHost(p); }

#define KVC_FORWARD_OP(Name, Args)                                                       \
  kernels::KernelStatus Name(const kernels::Args& a, kernels::StreamHandle h) override { \
    return inner_->Name(a, h);                                                           \
  }
  KVC_FORWARD_OP(WriteTokens, WriteTokensArgs)
  KVC_FORWARD_OP(ReadTokens, ReadTokensArgs)
  KVC_FORWARD_OP(ReadRecords, ReadRecordsArgs)
  KVC_FORWARD_OP(Gather, GatherArgs)
  KVC_FORWARD_OP(Rerotate, RerotateArgs)
  KVC_FORWARD_OP(SnapKvScore, SnapKvScoreArgs)
  KVC_FORWARD_OP(ExpectedAttentionScore, ExpectedAttentionScoreArgs)
  KVC_FORWARD_OP(AccumulateScores, AccumulateScoresArgs)
  KVC_FORWARD_OP(Select, SelectArgs)
  KVC_FORWARD_OP(ChecksumBlocks, ChecksumBlocksArgs)
  KVC_FORWARD_OP(AllocateBudgets, AllocateBudgetsArgs)
  KVC_FORWARD_OP(DecodeAttention, DecodeAttentionArgs)
#undef KVC_FORWARD_OP

 private:
  std::unique_ptr<kernels::KernelBackend> inner_;
};

}  // namespace kvc::testing
