// Shared CUDA plumbing: stream conversion, launch-error mapping, stream-ordered scratch,
// warp reductions, and the one head_dim dispatch point (elements per lane).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kvc/kernels/paged_view.h"
#include "kvc/kernels/status.h"

namespace kvc::kernels::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

inline cudaStream_t ToStream(StreamHandle s) { return static_cast<cudaStream_t>(s.native); }

// cudaGetErrorString returns static strings, so they fit KernelStatus::detail. A failed
// runtime call (cudaMemsetAsync, cudaFuncSetAttribute, ...) also leaves its error as the
// thread's last error; it is reported here, so it is cleared, or the next op's LaunchStatus
// would report it again for a launch that succeeded. (Sticky errors stay sticky.)
inline KernelStatus FromCuda(cudaError_t e) {
  if (e == cudaSuccess) return KernelStatus::Ok();
  cudaGetLastError();
  return KernelStatus::Internal(cudaGetErrorString(e));
}
inline KernelStatus LaunchStatus() { return FromCuda(cudaGetLastError()); }

// Dynamic shared memory a block of `kernel` may opt into on the current device: the
// device's per-block opt-in limit less the kernel's static shared memory.
template <typename Kernel>
inline KernelStatus MaxDynamicSharedBytes(Kernel kernel, size_t* bytes) {
  int device = 0, optin = 0;
  KVC_KERNEL_RETURN_IF_ERROR(FromCuda(cudaGetDevice(&device)));
  KVC_KERNEL_RETURN_IF_ERROR(
      FromCuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)));
  cudaFuncAttributes attr{};
  KVC_KERNEL_RETURN_IF_ERROR(FromCuda(cudaFuncGetAttributes(&attr, kernel)));
  const size_t limit = static_cast<size_t>(optin);
  *bytes = limit > attr.sharedSizeBytes ? limit - attr.sharedSizeBytes : 0;
  return KernelStatus::Ok();
}

// Scratch memory for one op, allocated and freed in stream order (cudaMallocAsync's pool
// makes this cheap and safe with several streams).
class Scratch {
 public:
  explicit Scratch(cudaStream_t stream) : stream_(stream) {}
  ~Scratch() {
    for (void* p : ptrs_) cudaFreeAsync(p, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  template <typename T>
  T* Alloc(size_t count, KernelStatus* status) {
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, count * sizeof(T) + 16, stream_);
    if (e != cudaSuccess) {
      cudaGetLastError();  // reported here; keep it out of the next LaunchStatus
      *status = KernelStatus{KernelStatusCode::kOutOfMemory, cudaGetErrorString(e)};
      return nullptr;
    }
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> ptrs_;
};

// Butterfly reduction over groups of kWidth lanes (32: the warp; 16: each half-warp); every
// lane ends with its group's result.
template <int kWidth, typename T, typename Op>
__device__ __forceinline__ T WarpReduce(T v, Op op) {
#pragma unroll
  for (int o = kWidth / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
struct FMaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct UMaxOp {
  __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const { return max(a, b); }
};
struct UMinOp {
  __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const { return min(a, b); }
};

__device__ __forceinline__ float WarpMax(float v) { return WarpReduce<32>(v, FMaxOp{}); }
__device__ __forceinline__ float WarpSum(float v) { return WarpReduce<32>(v, SumOp{}); }
// Unsigned max/min over the warp (or over each half-warp). Exact: the record codec reduces
// float bit patterns with these (AbsMax, OrderedBits of record_codec.h), so that NaNs and
// signed zeros behave as in QuantizeRecord; fmaxf/fminf would drop a NaN and may order -0
// and +0 either way.
__device__ __forceinline__ uint32_t WarpMaxU32(uint32_t v) { return WarpReduce<32>(v, UMaxOp{}); }
__device__ __forceinline__ uint32_t WarpMinU32(uint32_t v) { return WarpReduce<32>(v, UMinOp{}); }
__device__ __forceinline__ uint32_t HalfWarpMaxU32(uint32_t v) {
  return WarpReduce<16>(v, UMaxOp{});
}

// Lanes own elements j = lane + 32 k of a head_dim row, k < ceil(head_dim / 32). This is
// the single head_dim dispatch: kernels are templated on the per-lane element count.
template <typename F>
KernelStatus DispatchHeadDim(int head_dim, F&& f) {
  if (head_dim <= 64) return f(std::integral_constant<int, 2>{});
  if (head_dim <= 128) return f(std::integral_constant<int, 4>{});
  if (head_dim <= 256) return f(std::integral_constant<int, 8>{});
  if (head_dim <= 512) return f(std::integral_constant<int, 16>{});
  return KernelStatus::Unsupported("CUDA kernels support head_dim <= 512");
}

inline unsigned Blocks(int64_t items, int per_block) {
  return static_cast<unsigned>((items + per_block - 1) / per_block);
}

}  // namespace kvc::kernels::cuda
