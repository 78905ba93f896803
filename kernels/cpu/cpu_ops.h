// The CPU backend's ops: the reference algorithms restructured for threads (lanes, rows or
// token chunks spread over a ThreadPool) and for auto-vectorization (dtype switches
// hoisted out of element loops, multi-accumulator dot products). Arguments are validated.
#pragma once

#include "kvc/kernels/ops.h"
#include "kvc/kernels/thread_pool.h"

namespace kvc::kernels::cpu {

void WriteTokens(ThreadPool& pool, const WriteTokensArgs& a);
void ReadTokens(ThreadPool& pool, const ReadTokensArgs& a);
void ReadRecords(ThreadPool& pool, const ReadRecordsArgs& a);
void Gather(ThreadPool& pool, const GatherArgs& a);
void Rerotate(ThreadPool& pool, const RerotateArgs& a);
void ChecksumBlocks(ThreadPool& pool, const ChecksumBlocksArgs& a);
void SnapKvScore(ThreadPool& pool, const SnapKvScoreArgs& a);
void ExpectedAttentionScore(ThreadPool& pool, const ExpectedAttentionScoreArgs& a);
void AccumulateScores(ThreadPool& pool, const AccumulateScoresArgs& a);
void Select(ThreadPool& pool, const SelectArgs& a);
void AllocateBudgets(ThreadPool& pool, const AllocateBudgetsArgs& a);
void DecodeAttention(ThreadPool& pool, const DecodeAttentionArgs& a);

}  // namespace kvc::kernels::cpu
