// CUDA budget allocation (AdaKV): one block per group of lanes. Per lane, radix selects find
// the sink/recent boundaries (by position) and the floor's last token (by score); one radix
// select over the whole group, keyed (score, position, lane * max_tokens + index), finds the
// last token the shared remainder reaches. Same keys as Select, so the same tokens as the
// reference.
#include <math.h>

#include <climits>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/radix_select.cuh"

namespace kvc::kernels::cuda {
namespace {

constexpr int kBudgetThreads = 256;
constexpr int kMaxGroupLanes = 128;

struct BudgetShared {
  SelectShared sel;
  uint32_t low_t[kMaxGroupLanes][3];    // last sink, by position
  uint32_t high_t[kMaxGroupLanes][3];   // first recent token, by position
  uint32_t floor_t[kMaxGroupLanes][3];  // last floor token, by score
  int lo[kMaxGroupLanes], hi[kMaxGroupLanes], floor[kMaxGroupLanes], count[kMaxGroupLanes];
  int pooled;
};

__global__ void BudgetPrepKernel(AllocateBudgetsArgs a, uint32_t* pos_key, uint32_t* score_key) {
  const int32_t lane = blockIdx.y;
  const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.num_tokens[lane]) return;
  const size_t i = static_cast<size_t>(lane) * a.max_tokens + t;
  pos_key[i] = static_cast<uint32_t>(a.positions[i]) ^ 0x80000000u;
  score_key[i] = ~OrderedFloat(a.scores[i]);  // ascending key = descending score
}

__global__ void AllocateBudgetsKernel(AllocateBudgetsArgs a, const uint32_t* pos_key,
                                      const uint32_t* score_key) {
  __shared__ BudgetShared sh;
  const int32_t first = blockIdx.x * a.group_lanes;
  const int32_t stride = a.max_tokens;
  auto all = [](int) { return true; };
  // A candidate ranks in [lo, hi) by position; the floor is its lane's best `floor` of them.
  auto candidate = [&](int j, int t) {
    const KeyView by_pos{nullptr, pos_key + static_cast<size_t>(first + j) * stride};
    if (sh.hi[j] <= sh.lo[j]) return false;
    if (sh.lo[j] > 0 && KeyLessEq(by_pos, t, sh.low_t[j])) return false;
    if (sh.hi[j] >= a.num_tokens[first + j]) return true;
    // Below the first recent token; position keys end with the index, so equality is t.
    return KeyLessEq(by_pos, t, sh.high_t[j]) && static_cast<uint32_t>(t) != sh.high_t[j][1];
  };
  auto in_floor = [&](int j, int t) {
    const size_t row = static_cast<size_t>(first + j) * stride;
    const KeyView by_score{score_key + row, pos_key + row};
    if (sh.floor[j] <= 0) return false;
    return sh.floor[j] >= sh.hi[j] - sh.lo[j] || KeyLessEq(by_score, t, sh.floor_t[j]);
  };
  for (int j = 0; j < a.group_lanes; ++j) {
    const int32_t n = a.num_tokens[first + j];
    const size_t row = static_cast<size_t>(first + j) * stride;
    const KeyView by_pos{nullptr, pos_key + row};
    const KeyView by_score{score_key + row, pos_key + row};
    const int lo = min(a.sinks, n), hi = max(lo, n - a.recent);
    if (threadIdx.x == 0) {
      sh.lo[j] = lo;
      sh.hi[j] = hi;
      sh.floor[j] = min(a.floor, hi - lo);
      sh.count[j] = 0;
    }
    __syncthreads();
    uint32_t t3[3];
    if (lo > 0 && hi > lo) {
      KthSmallest(by_pos, n, lo - 1, all, sh.sel, t3);
      if (threadIdx.x == 0)
        for (int w = 0; w < 3; ++w) sh.low_t[j][w] = t3[w];
    }
    if (hi < n && hi > lo) {
      KthSmallest(by_pos, n, hi, all, sh.sel, t3);
      if (threadIdx.x == 0)
        for (int w = 0; w < 3; ++w) sh.high_t[j][w] = t3[w];
    }
    __syncthreads();
    const int floor = sh.floor[j];
    if (floor > 0 && floor < hi - lo) {
      KthSmallest(
          by_score, n, floor - 1, [&](int t) { return candidate(j, t); }, sh.sel, t3);
      if (threadIdx.x == 0)
        for (int w = 0; w < 3; ++w) sh.floor_t[j][w] = t3[w];
    }
    __syncthreads();
  }
  const int total = a.group_lanes * stride;
  auto pooled = [&](int i) {
    const int j = i / stride, t = i % stride;
    return t < a.num_tokens[first + j] && candidate(j, t) && !in_floor(j, t);
  };
  if (threadIdx.x == 0) sh.pooled = 0;
  __syncthreads();
  int mine = 0;
  for (int i = threadIdx.x; i < total; i += blockDim.x) mine += pooled(i) ? 1 : 0;
  atomicAdd(&sh.pooled, mine);
  __syncthreads();
  int floors = 0;
  for (int j = 0; j < a.group_lanes; ++j) floors += sh.floor[j];
  const int rest = min(max(0, max(0, a.totals[blockIdx.x]) - floors), sh.pooled);
  const KeyView group{score_key + static_cast<size_t>(first) * stride,
                      pos_key + static_cast<size_t>(first) * stride};
  const bool cut = rest > 0 && rest < sh.pooled;
  uint32_t cut_t[3] = {0, 0, 0};  // every thread computes the same key
  if (cut) KthSmallest(group, total, rest - 1, pooled, sh.sel, cut_t);
  if (rest > 0) {
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
      if (pooled(i) && (!cut || KeyLessEq(group, i, cut_t))) atomicAdd(&sh.count[i / stride], 1);
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < a.group_lanes; j += blockDim.x) {
    a.budgets[first + j] = sh.floor[j] + sh.count[j];
  }
}

}  // namespace

KernelStatus LaunchAllocateBudgets(const AllocateBudgetsArgs& a, StreamHandle stream) {
  if (a.num_lanes == 0) return KernelStatus::Ok();
  if (a.group_lanes > kMaxGroupLanes) {
    return KernelStatus::Unsupported("CUDA: AllocateBudgets takes at most 128 lanes per group");
  }
  const int64_t groups = a.num_lanes / a.group_lanes;
  if (groups > INT_MAX || static_cast<int64_t>(a.group_lanes) * a.max_tokens > INT_MAX ||
      a.num_lanes > 65535) {
    return KernelStatus::Unsupported("CUDA: AllocateBudgets group too large");
  }
  const cudaStream_t s = ToStream(stream);
  KernelStatus status = KernelStatus::Ok();
  Scratch scratch(s);
  const size_t count = static_cast<size_t>(a.num_lanes) * (a.max_tokens > 0 ? a.max_tokens : 1);
  uint32_t* pos_key = scratch.Alloc<uint32_t>(count, &status);
  uint32_t* score_key = scratch.Alloc<uint32_t>(count, &status);
  KVC_KERNEL_RETURN_IF_ERROR(status);
  if (a.max_tokens > 0) {
    BudgetPrepKernel<<<dim3(Blocks(a.max_tokens, 256), a.num_lanes), 256, 0, s>>>(a, pos_key,
                                                                                  score_key);
    KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  }
  AllocateBudgetsKernel<<<static_cast<unsigned>(groups), kBudgetThreads, 0, s>>>(a, pos_key,
                                                                                 score_key);
  return LaunchStatus();
}

}  // namespace kvc::kernels::cuda
