// The reference backend's ops: slow, obvious, single-threaded scalar code. This is the
// executable specification the CPU and CUDA backends are tested against. Arguments are
// already validated (base/host_backend.h).
#pragma once

#include "kvc/kernels/ops.h"

namespace kvc::kernels::reference {

void WriteTokens(const WriteTokensArgs& a);
void ReadTokens(const ReadTokensArgs& a);
void ReadRecords(const ReadRecordsArgs& a);
void Gather(const GatherArgs& a);
void Rerotate(const RerotateArgs& a);
void ChecksumBlocks(const ChecksumBlocksArgs& a);
void SnapKvScore(const SnapKvScoreArgs& a);
void ExpectedAttentionScore(const ExpectedAttentionScoreArgs& a);
void AccumulateScores(const AccumulateScoresArgs& a);
void Select(const SelectArgs& a);
void AllocateBudgets(const AllocateBudgetsArgs& a);
void DecodeAttention(const DecodeAttentionArgs& a);

}  // namespace kvc::kernels::reference
