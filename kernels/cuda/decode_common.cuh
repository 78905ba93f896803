// Shared by the two decode partial kernels (attention.cu, attention_fast.cu): the chunking
// and the per-chunk partial results that the combine and weights kernels read.
#pragma once

#include "cuda/cuda_common.cuh"

namespace kvc::kernels::cuda {

constexpr int kDecodeChunk = 64;  // stored tokens per block of the partial kernels

struct DecodeScratch {
  float* part_m;    // [lanes][chunks][G]
  float* part_l;    // [lanes][chunks][G]
  float* part_acc;  // [lanes][chunks][G][d]
  float2* stats;    // [lanes][G] global (max, sum)
  float* logits;    // [lanes][G][max_tokens], or null when no weights are needed
  int chunks;
};

// The fast partial kernel (head_dim 64/128, group <= 8) when it applies and is enabled
// (KVC_CUDA_DECODE=fast); returns false to fall back to the general kernel.
bool DecodeFastApplies(const DecodeAttentionArgs& a);
KernelStatus LaunchDecodePartialFast(const DecodeAttentionArgs& a, float scale,
                                     const DecodeScratch& w, cudaStream_t s);

}  // namespace kvc::kernels::cuda
