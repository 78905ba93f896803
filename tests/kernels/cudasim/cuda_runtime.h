// cudasim: runs kernels/cuda's kernels on the host, so that their logic (indexing, shared
// memory, barriers, warp collectives, launch limits) is checked against the reference on
// machines without a GPU, and stands in as the CUDA runtime of code that drives a device
// (streams, copies, pinned staging), which it checks for the host-side mistakes a GPU
// punishes. It replaces <cuda_runtime.h> when kernels/cuda's sources are compiled as C++
// (transform.cmake rewrites what C++ cannot express: `k<<<cfg>>>(args)` launches,
// `extern __shared__`, and static `__shared__` declarations, which it registers).
//
// Model:
// - One simulated GPU executes one thing at a time: every grid, copy and memset runs under
//   one global device lock, so any number of host threads may call the runtime at once.
// - Streams are FIFO queues. Launches (with a copy of their arguments), cudaMemcpyAsync,
//   cudaMemsetAsync, and cudaMallocAsync's poisoning / cudaFreeAsync's release are queued
//   and run only at a synchronization point: cudaStreamSynchronize(s) runs what s waits
//   for, cudaDeviceSynchronize everything, the blocking cudaMemcpy/cudaMemset and the
//   legacy stream (nullptr) wait for the legacy stream and the blocking streams' earlier
//   work (not for cudaStreamNonBlocking streams), cudaFree/cudaFreeHost/cudaStreamDestroy
//   run the queued work first, and cudaStreamQuery answers cudaErrorNotReady once while it
//   runs the stream's work. So a host that reads a result before synchronizing sees stale
//   bytes. Pageable host sources are staged at the call (as CUDA does); pinned sources
//   (cudaMallocHost/cudaHostAlloc) and every destination are accessed when the copy runs.
// - Device memory (cudaMalloc/cudaMallocAsync) is mmap'd PROT_NONE and opened only while
//   device work runs: host code that dereferences it dies with SIGSEGV (and a message).
//   Each allocation ends at a guard page (256-byte aligned) so device work past its end
//   faults too; under ASan the slack around it is poisoned. A simulated capacity
//   (KVC_CUDASIM_DEVICE_BYTES, default 8 GiB) bounds cudaMalloc and feeds cudaMemGetInfo.
//   Copies and memsets are checked against the allocations (range, direction).
// - Errors: launch-configuration errors become the launching thread's cudaGetLastError();
//   errors while a grid executes (a barrier or collective not every thread reaches, ...)
//   are returned by the call that synchronizes its stream. The last error is per thread.
// - A launch runs its blocks in turn (forward, reverse, or a seeded random permutation:
//   KVC_CUDASIM_ORDER=forward|reverse|shuffle, KVC_CUDASIM_SEED); the threads of a block are
//   fibers on the executing host thread, switched only where CUDA threads wait for each
//   other (__syncthreads, warp shuffles/ballots/__syncwarp) and resumed in thread order,
//   reverse, or shuffled per block. So barriers and collectives have CUDA's semantics, and
//   a collective that not every named lane reaches (divergence, exited lanes) or a barrier
//   some threads never reach is reported as a launch failure instead of hanging. Dynamic
//   shared memory and static `__shared__` variables are poisoned (0xff bytes: NaN floats)
//   at every block start; fresh cudaMallocAsync memory too (fresh cudaMalloc reads zero).
//
// - IPC: device allocations of at least 1 MiB are backed by a memfd, so that
//   cudaIpcGetMemHandle can name them (pid, fd, inode) and cudaIpcOpenMemHandle in ANOTHER
//   process maps the same pages (through /proc/<pid>/fd/<fd>; same user) with the same guard
//   pages and PROT_NONE rule; the exporting process opening its own handle gets
//   cudaErrorDeviceUninitialized ("invalid device context", as CUDA refuses it), a handle of
//   a freed allocation or an exited process cudaErrorInvalidResourceHandle, a smaller
//   allocation cannot be exported (cudaErrorInvalidValue). The processes' simulated devices
//   stay separate otherwise: no ordering between them (CUDA needs IPC events for that).
//
// Not modelled: real concurrency between threads of a block between barriers (a missing
// __syncthreads is found only when the resume order exposes it), concurrency between
// streams or with the host (work runs only when someone synchronizes; a host access to
// device memory while another thread's device work runs is not caught), kernels
// dereferencing host pointers (host memory stays accessible to them), events, graphs,
// managed memory, several devices, memory coalescing, timing, and f16 conversions of
// device PTX (the host versions run: NaN payloads may differ).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __launch_bounds__(...)
// Only for headers that transform.cmake does not see (kernels/cuda's .cuh have none): a
// plain function static is block-shared but not poisoned per block.
#define __shared__ static

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  // Implicit, as CUDA's: launches write `<<<blocks, threads>>>` with plain integers.
  // NOLINTNEXTLINE(google-explicit-constructor)
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
constexpr int warpSize = 32;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorDeviceUninitialized = 201,  // "invalid device context"
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;
struct cudaIpcMemHandle_t {
  char reserved[64];
};
constexpr unsigned cudaIpcMemLazyEnablePeerAccess = 1;
struct CUstream_st;
using cudaStream_t = CUstream_st*;
constexpr unsigned cudaStreamDefault = 0;
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaHostAllocDefault = 0;
constexpr int cudaInvalidDeviceId = -2;
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  int maxThreadsPerBlock;
  int maxDynamicSharedSizeBytes;
};
struct cudaDeviceProp {
  char name[256];
  int major, minor;
  size_t totalGlobalMem;
  int multiProcessorCount;
};

namespace kvc_sim {

// The running thread's coordinates (set by the scheduler before it resumes a fiber).
extern uint3 thread_idx, block_idx;
extern dim3 block_dim, grid_dim;

// Launch configuration of `kernel<<<grid, block, smem, stream>>>`.
struct Cfg {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  Cfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr)
      : grid(g), block(b), smem(s), stream(st) {}
};

// Checks `cfg` now (errors become the calling thread's next cudaGetLastError(), as CUDA
// reports launch-configuration errors) and queues the grid on cfg.stream: body() then runs
// as every thread of every block when the stream is synchronized. `kernel` keys the dynamic
// shared memory attribute.
void Launch(const void* kernel, const Cfg& cfg, std::function<void()> body);
void* DynamicSharedBase();
// A static `__shared__` variable (transform.cmake adds the call after its declaration):
// its bytes are poisoned (0xff: NaN floats, -1 integers, wild pointers) the first time a
// thread of each block reaches the declaration, so before any thread of that block can
// write it; stale values of the previous block are never seen.
void SharedVar(void* addr, size_t bytes);
// Block and thread order (KVC_CUDASIM_ORDER=forward|reverse|shuffle, KVC_CUDASIM_SEED),
// for tests of the simulator that compare orders in one process.
enum class Order { kForward, kReverse, kShuffle };
void SetOrder(Order order, uint64_t seed);
void SyncThreads();
// Waits until every lane of `mask` in this warp has arrived with the same mask, having
// published `mine`; returns what lane `src` published (own value if src is not in mask).
uint64_t WarpExchange(unsigned mask, uint64_t mine, int src);
unsigned WarpBallot(unsigned mask, bool pred);
int LaneId();
void SetError(cudaError_t e, const char* what);

template <class... P>
struct Bound {
  void (*kernel)(P...);
  Cfg cfg;
};
template <class... P>
Bound<P...> operator%(void (*kernel)(P...), const Cfg& cfg) {
  return Bound<P...>{kernel, cfg};
}
template <class... A>
std::tuple<std::decay_t<A>...> Args(A&&... a) {
  return std::tuple<std::decay_t<A>...>(std::forward<A>(a)...);
}
// The queued grid holds a copy of the arguments taken at launch (as CUDA copies kernel
// parameters), and each thread gets its own copy of them, as on the device.
template <class... P, class... A>
void operator^(const Bound<P...>& b, const std::tuple<A...>& args) {
  Launch(reinterpret_cast<const void*>(b.kernel), b.cfg, [kernel = b.kernel, args] {
    std::tuple<P...> own(args);
    std::apply(kernel, own);
  });
}

template <class T>
uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of <= 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}
template <class T>
T FromBits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

cudaError_t SetFuncMaxDynamicShared(const void* kernel, int bytes);

}  // namespace kvc_sim

#define threadIdx (::kvc_sim::thread_idx)
#define blockIdx (::kvc_sim::block_idx)
#define blockDim (::kvc_sim::block_dim)
#define gridDim (::kvc_sim::grid_dim)

inline void __syncthreads() { kvc_sim::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { kvc_sim::WarpExchange(mask, 0, 0); }
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = warpSize) {
  const int lane = kvc_sim::LaneId();
  const int base = lane & ~(width - 1);
  return kvc_sim::FromBits<T>(
      kvc_sim::WarpExchange(mask, kvc_sim::ToBits(v), base + (src & (width - 1))));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
  const int lane = kvc_sim::LaneId();
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return kvc_sim::FromBits<T>(kvc_sim::WarpExchange(mask, kvc_sim::ToBits(v), src));
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  const int lane = kvc_sim::LaneId();
  int src = lane + static_cast<int>(delta);
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return kvc_sim::FromBits<T>(kvc_sim::WarpExchange(mask, kvc_sim::ToBits(v), src));
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  const int lane = kvc_sim::LaneId();
  int src = lane - static_cast<int>(delta);
  if (src < (lane & ~(width - 1))) src = lane;
  return kvc_sim::FromBits<T>(kvc_sim::WarpExchange(mask, kvc_sim::ToBits(v), src));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return kvc_sim::WarpBallot(mask, pred != 0);
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(static_cast<unsigned>(v)); }
inline unsigned __float_as_uint(float f) { return kvc_sim::FromBits<unsigned>(kvc_sim::ToBits(f)); }
inline float __uint_as_float(unsigned u) { return kvc_sim::FromBits<float>(kvc_sim::ToBits(u)); }
inline int __float_as_int(float f) { return kvc_sim::FromBits<int>(kvc_sim::ToBits(f)); }
inline float __int_as_float(int i) { return kvc_sim::FromBits<float>(kvc_sim::ToBits(i)); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// Fibers never run concurrently (and one grid runs at a time), so read-modify-write is atomic.
template <class T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
T atomicMax(T* p, T v) {
  const T old = *p;
  *p = old > v ? old : v;
  return old;
}
// CUDA's integer min/max overloads (device code calls them unqualified).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

// ---- runtime API ----
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void* p, cudaStream_t s);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p);
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void* p);
template <class T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
template <class T>
cudaError_t cudaMallocAsync(T** p, size_t bytes, cudaStream_t s) {
  return cudaMallocAsync(reinterpret_cast<void**>(p), bytes, s);
}
template <class T>
cudaError_t cudaMallocHost(T** p, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(p), bytes);
}
template <class T>
cudaError_t cudaHostAlloc(T** p, size_t bytes, unsigned flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(p), bytes, flags);
}
template <class F>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, F* kernel) {
  (void)kernel;
  *attr = cudaFuncAttributes{0, 1024, 48 * 1024};
  return cudaSuccess;
}
template <class F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return kvc_sim::SetFuncMaxDynamicShared(reinterpret_cast<const void*>(kernel), value);
}
