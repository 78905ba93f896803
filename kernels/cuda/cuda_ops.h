// Host launchers of the CUDA kernels (plain C++ header: no CUDA types, so cuda_backend.cc
// and the .cu files share it cheaply). Arguments are scalar-validated by the caller; index
// arrays live in device memory and are trusted (the service validates them).
#pragma once

#include "kvc/kernels/ops.h"
#include "kvc/kernels/status.h"

namespace kvc::kernels::cuda {

KernelStatus LaunchWriteTokens(const WriteTokensArgs& a, StreamHandle stream);
KernelStatus LaunchReadTokens(const ReadTokensArgs& a, StreamHandle stream);
KernelStatus LaunchReadRecords(const ReadRecordsArgs& a, StreamHandle stream);
KernelStatus LaunchGather(const GatherArgs& a, StreamHandle stream);
KernelStatus LaunchRerotate(const RerotateArgs& a, StreamHandle stream);
KernelStatus LaunchChecksumBlocks(const ChecksumBlocksArgs& a, StreamHandle stream);
KernelStatus LaunchSnapKvScore(const SnapKvScoreArgs& a, StreamHandle stream);
KernelStatus LaunchExpectedAttentionScore(const ExpectedAttentionScoreArgs& a, StreamHandle stream);
KernelStatus LaunchAccumulateScores(const AccumulateScoresArgs& a, StreamHandle stream);
KernelStatus LaunchSelect(const SelectArgs& a, StreamHandle stream);
KernelStatus LaunchAllocateBudgets(const AllocateBudgetsArgs& a, StreamHandle stream);
KernelStatus LaunchDecodeAttention(const DecodeAttentionArgs& a, StreamHandle stream);

}  // namespace kvc::kernels::cuda
