// CUDA selection: one block per lane, exact radix select over unique composite keys, so the
// kept set equals the reference's (score desc, then position asc, then stored index).
#include <math.h>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/radix_select.cuh"

namespace kvc::kernels::cuda {
namespace {

constexpr int kSelectThreads = 256;

__global__ void SelectPrepKernel(SelectArgs a, uint32_t* pos_key, uint32_t* score_key) {
  const int32_t lane = blockIdx.y;
  const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.max_tokens) return;
  const size_t i = static_cast<size_t>(lane) * a.max_tokens + t;
  a.keep[i] = 0;
  if (t >= a.num_tokens[lane]) return;
  pos_key[i] = static_cast<uint32_t>(a.positions[i]) ^ 0x80000000u;
  score_key[i] = ~OrderedFloat(a.scores[i]);  // ascending key = descending score
}

__global__ void SelectKernel(SelectArgs a, const uint32_t* pos_key, const uint32_t* score_key) {
  __shared__ SelectShared sh;
  const int32_t lane = blockIdx.x;
  const int32_t n = a.num_tokens[lane];
  const size_t row = static_cast<size_t>(lane) * a.max_tokens;
  uint8_t* keep = a.keep + row;
  const int budget = a.budgets != nullptr ? max(0, a.budgets[lane]) : a.budget;
  if (static_cast<int64_t>(n) <= static_cast<int64_t>(a.sinks) + a.recent + budget) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) keep[i] = 1;
    return;
  }
  const KeyView by_pos{nullptr, pos_key + row};
  const KeyView by_score{score_key + row, pos_key + row};
  uint32_t sink_t[3], recent_t[3], heavy_t[3];
  auto all = [](int) { return true; };
  if (a.sinks > 0) KthSmallest(by_pos, n, a.sinks - 1, all, sh, sink_t);
  if (a.recent > 0) KthSmallest(by_pos, n, n - a.recent, all, sh, recent_t);
  auto is_sink = [&](int i) { return a.sinks > 0 && KeyLessEq(by_pos, i, sink_t); };
  auto is_recent = [&](int i) {
    if (a.recent <= 0) return false;
    // pos key >= recent threshold <=> not (key < threshold)
    for (int w = 0; w < 2; ++w) {
      const uint32_t x = by_pos.Word(i, w);
      if (x != recent_t[w]) return x > recent_t[w];
    }
    return true;
  };
  auto rest = [&](int i) { return !is_sink(i) && !is_recent(i); };
  if (budget > 0) KthSmallest(by_score, n, budget - 1, rest, sh, heavy_t);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const bool heavy = budget > 0 && rest(i) && KeyLessEq(by_score, i, heavy_t);
    keep[i] = (is_sink(i) || is_recent(i) || heavy) ? 1 : 0;
  }
}

}  // namespace

KernelStatus LaunchSelect(const SelectArgs& a, StreamHandle stream) {
  // max_tokens == 0: every lane is empty and keep has no entries (no grid to launch).
  if (a.num_lanes == 0 || a.max_tokens == 0) return KernelStatus::Ok();
  if (a.num_lanes > 65535) return KernelStatus::Unsupported("CUDA: at most 65535 lanes per call");
  const cudaStream_t s = ToStream(stream);
  KernelStatus status = KernelStatus::Ok();
  Scratch scratch(s);
  const size_t count = static_cast<size_t>(a.num_lanes) * a.max_tokens;
  uint32_t* pos_key = scratch.Alloc<uint32_t>(count, &status);
  uint32_t* score_key = scratch.Alloc<uint32_t>(count, &status);
  KVC_KERNEL_RETURN_IF_ERROR(status);
  SelectPrepKernel<<<dim3(Blocks(a.max_tokens, 256), a.num_lanes), 256, 0, s>>>(a, pos_key,
                                                                                score_key);
  KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  SelectKernel<<<a.num_lanes, kSelectThreads, 0, s>>>(a, pos_key, score_key);
  return LaunchStatus();
}

}  // namespace kvc::kernels::cuda
