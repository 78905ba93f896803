// CUDA selection (one block per lane, exact radix select over unique composite keys, so the
// kept set equals the reference's: score desc, then position asc, then stored index) and
// tail-to-hole compaction (a block per lane ranks holes and tail survivors with warp ballots;
// a second grid moves the records, one warp per move).
#include <math.h>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"

namespace kvc::kernels::cuda {
namespace {

constexpr int kSelectThreads = 256;

__device__ __forceinline__ uint32_t OrderedFloat(float f) {
  if (isnan(f)) f = -INFINITY;  // NaN ranks lowest
  if (f == 0.0f) f = 0.0f;      // -0 ties with +0, as float comparison does
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void SelectPrepKernel(SelectArgs a, uint32_t* pos_key, uint32_t* score_key) {
  const int32_t lane = blockIdx.y;
  const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.lanes.max_tokens) return;
  const size_t i = static_cast<size_t>(lane) * a.lanes.max_tokens + t;
  a.keep[i] = 0;
  if (t >= a.lanes.num_tokens[lane]) return;
  int32_t b, s;
  LaneTokenSlot(a.lanes, a.arena.layout.block_tokens, lane, t, &b, &s);
  pos_key[i] = static_cast<uint32_t>(*PositionPtr(a.arena, b, s)) ^ 0x80000000u;
  score_key[i] = ~OrderedFloat(*ScorePtr(a.arena, b, s));  // ascending key = descending score
}

// Keys per token i: words (score_key?, pos_key, i), most significant first.
struct KeyView {
  const uint32_t* score;  // null for position-only keys
  const uint32_t* pos;
  __device__ int Words() const { return score != nullptr ? 3 : 2; }
  __device__ uint32_t Word(int i, int w) const {
    if (score == nullptr) ++w;
    return w == 0 ? score[i] : (w == 1 ? pos[i] : static_cast<uint32_t>(i));
  }
};

__device__ bool KeyLessEq(const KeyView& kv, int i, const uint32_t (&t)[3]) {
  for (int w = 0; w < kv.Words(); ++w) {
    const uint32_t x = kv.Word(i, w);
    if (x != t[w]) return x < t[w];
  }
  return true;
}

struct SelectShared {
  uint32_t hist[256];
  int digit, remaining;
};

// The key of rank k (0-based, ascending) among tokens with include(i), 8 bits per pass.
template <typename Include>
__device__ void KthSmallest(const KeyView& kv, int n, int k, Include include, SelectShared& sh,
                            uint32_t (&out)[3]) {
  out[0] = out[1] = out[2] = 0;
  int remaining = k;
  for (int w = 0; w < kv.Words(); ++w) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) sh.hist[i] = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (!include(i)) continue;
        bool match = true;
        for (int u = 0; u < w; ++u) match &= kv.Word(i, u) == out[u];
        const uint32_t x = kv.Word(i, w);
        if (shift < 24) match &= (x >> (shift + 8)) == (out[w] >> (shift + 8));
        if (match) atomicAdd(&sh.hist[(x >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int acc = 0, digit = 0;
        for (; digit < 255; ++digit) {
          if (acc + static_cast<int>(sh.hist[digit]) > remaining) break;
          acc += sh.hist[digit];
        }
        sh.digit = digit;
        sh.remaining = remaining - acc;
      }
      __syncthreads();
      out[w] |= static_cast<uint32_t>(sh.digit) << shift;
      remaining = sh.remaining;
      __syncthreads();
    }
  }
}

__global__ void SelectKernel(SelectArgs a, const uint32_t* pos_key, const uint32_t* score_key) {
  __shared__ SelectShared sh;
  const int32_t lane = blockIdx.x;
  const int32_t n = a.lanes.num_tokens[lane];
  const size_t row = static_cast<size_t>(lane) * a.lanes.max_tokens;
  uint8_t* keep = a.keep + row;
  const int64_t budget_raw = a.budgets != nullptr ? a.budgets[lane] : a.budget;
  const int budget = budget_raw > 0 ? static_cast<int>(budget_raw) : 0;
  if (static_cast<int64_t>(n) <= static_cast<int64_t>(a.sinks) + a.recent + budget) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) keep[i] = 1;
    if (a.kept != nullptr && threadIdx.x == 0) a.kept[lane] = n;
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
  if (a.kept != nullptr && threadIdx.x == 0) a.kept[lane] = a.sinks + a.recent + budget;
}

constexpr int kCompactThreads = 256;

// Block-wide exclusive rank of `flag` among this pass's threads; returns the pass total.
__device__ int BlockRank(bool flag, int* rank, int* warp_totals) {
  const unsigned ballot = __ballot_sync(kFullMask, flag);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int in_warp = __popc(ballot & ((1u << lane) - 1u));
  if (lane == 0) warp_totals[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    if (w < warp) before += warp_totals[w];
    total += warp_totals[w];
  }
  *rank = before + in_warp;
  __syncthreads();
  return total;
}

__global__ void CompactPlanKernel(CompactArgs a, int32_t* holes, int32_t* sources, int32_t* moves) {
  __shared__ int warp_totals[kCompactThreads / 32];
  __shared__ int kept_sh;
  const int32_t lane = blockIdx.x;
  const int32_t n = a.lanes.num_tokens[lane];
  const size_t row = static_cast<size_t>(lane) * a.lanes.max_tokens;
  const uint8_t* keep = a.keep + row;
  if (threadIdx.x == 0) kept_sh = 0;
  __syncthreads();
  int local = 0;
  for (int t = threadIdx.x; t < n; t += blockDim.x) local += keep[t] != 0;
  atomicAdd(&kept_sh, local);
  __syncthreads();
  const int kept = kept_sh;
  int hole_base = 0, src_base = 0;
  for (int base = 0; base < n; base += blockDim.x) {
    const int t = base + threadIdx.x;
    const bool k = t < n && keep[t] != 0;
    const bool is_hole = t < kept && !k;
    const bool is_src = t >= kept && k;
    int r;
    const int holes_here = BlockRank(is_hole, &r, warp_totals);
    if (is_hole) holes[row + hole_base + r] = t;
    hole_base += holes_here;
    const int srcs_here = BlockRank(is_src, &r, warp_totals);
    if (is_src) sources[row + src_base + r] = t;
    src_base += srcs_here;
  }
  if (threadIdx.x == 0) {
    a.new_num_tokens[lane] = kept;
    a.new_num_blocks[lane] = (kept + a.arena.layout.block_tokens - 1) / a.arena.layout.block_tokens;
    moves[lane] = hole_base;
    if (a.moved != nullptr) a.moved[lane] = hole_base;
  }
}

__global__ void CompactMoveKernel(CompactArgs a, const int32_t* holes, const int32_t* sources,
                                  const int32_t* moves) {
  const int32_t lane = blockIdx.y;
  const int m = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (m >= moves[lane]) return;
  const int l = threadIdx.x & 31;
  const size_t row = static_cast<size_t>(lane) * a.lanes.max_tokens;
  const int bt = a.arena.layout.block_tokens;
  int32_t db, ds, sb, ss;
  LaneTokenSlot(a.lanes, bt, lane, holes[row + m], &db, &ds);
  LaneTokenSlot(a.lanes, bt, lane, sources[row + m], &sb, &ss);
  const int words = static_cast<int>(a.arena.layout.record_bytes / 4);
  const uint32_t* sk = reinterpret_cast<const uint32_t*>(KeyRecord(a.arena, sb, ss));
  const uint32_t* sv = reinterpret_cast<const uint32_t*>(ValueRecord(a.arena, sb, ss));
  uint32_t* dk = reinterpret_cast<uint32_t*>(KeyRecord(a.arena, db, ds));
  uint32_t* dv = reinterpret_cast<uint32_t*>(ValueRecord(a.arena, db, ds));
  for (int w = l; w < words; w += 32) {
    dk[w] = sk[w];
    dv[w] = sv[w];
  }
  if (l == 0) {
    *PositionPtr(a.arena, db, ds) = *PositionPtr(a.arena, sb, ss);
    *ScorePtr(a.arena, db, ds) = *ScorePtr(a.arena, sb, ss);
  }
}

}  // namespace

KernelStatus LaunchSelect(const SelectArgs& a, StreamHandle stream) {
  if (a.lanes.num_lanes == 0) return KernelStatus::Ok();
  const cudaStream_t s = ToStream(stream);
  if (a.lanes.max_tokens == 0) {
    // Every lane is empty: no keep entries, but the reference still reports kept = 0 per
    // lane (the kernels below would need an empty grid).
    if (a.kept == nullptr) return KernelStatus::Ok();
    return FromCuda(
        cudaMemsetAsync(a.kept, 0, static_cast<size_t>(a.lanes.num_lanes) * sizeof(int32_t), s));
  }
  if (a.lanes.num_lanes > 65535)
    return KernelStatus::Unsupported("CUDA: at most 65535 lanes per call");
  KernelStatus status = KernelStatus::Ok();
  Scratch scratch(s);
  const size_t count = static_cast<size_t>(a.lanes.num_lanes) * a.lanes.max_tokens;
  uint32_t* pos_key = scratch.Alloc<uint32_t>(count, &status);
  uint32_t* score_key = scratch.Alloc<uint32_t>(count, &status);
  KVC_KERNEL_RETURN_IF_ERROR(status);
  SelectPrepKernel<<<dim3(Blocks(a.lanes.max_tokens, 256), a.lanes.num_lanes), 256, 0, s>>>(
      a, pos_key, score_key);
  KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  SelectKernel<<<a.lanes.num_lanes, kSelectThreads, 0, s>>>(a, pos_key, score_key);
  return LaunchStatus();
}

KernelStatus LaunchCompact(const CompactArgs& a, StreamHandle stream) {
  if (a.lanes.num_lanes == 0) return KernelStatus::Ok();
  if (a.lanes.num_lanes > 65535)
    return KernelStatus::Unsupported("CUDA: at most 65535 lanes per call");
  const cudaStream_t s = ToStream(stream);
  KernelStatus status = KernelStatus::Ok();
  Scratch scratch(s);
  const size_t count = static_cast<size_t>(a.lanes.num_lanes) * (a.lanes.max_tokens + 1);
  int32_t* holes = scratch.Alloc<int32_t>(count, &status);
  int32_t* sources = scratch.Alloc<int32_t>(count, &status);
  int32_t* moves = scratch.Alloc<int32_t>(a.lanes.num_lanes, &status);
  KVC_KERNEL_RETURN_IF_ERROR(status);
  CompactPlanKernel<<<a.lanes.num_lanes, kCompactThreads, 0, s>>>(a, holes, sources, moves);
  KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  const int max_moves = a.lanes.max_tokens / 2 + 1;
  CompactMoveKernel<<<dim3(Blocks(max_moves, 8), a.lanes.num_lanes), 256, 0, s>>>(a, holes, sources,
                                                                                  moves);
  return LaunchStatus();
}

}  // namespace kvc::kernels::cuda
