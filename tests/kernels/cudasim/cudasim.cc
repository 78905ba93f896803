// cudasim's scheduler and runtime (see cuda_runtime.h): work queued per stream runs at
// synchronization points under one device lock, with device memory opened (mprotect) only
// then; blocks run one after another, the threads of a block are fibers switched by a small
// x86-64 context switch at barriers and warp collectives.
// The pieces, one concept each: cudasim_memory.cc (device and pinned memory),
// cudasim_streams.cc (stream queues and their draining), cudasim_scheduler.cc (launches,
// fibers, barriers, warp collectives); cudasim_internal.h declares what they share. This file
// holds the CUDA runtime API's entry points and the per-thread last error.
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_runtime.h"
#include "cudasim_internal.h"

namespace kvc_sim::internal {

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local bool t_executing = false;

cudaError_t Fail(cudaError_t e) {
  if (t_last_error == cudaSuccess) t_last_error = e;
  return e;
}

}  // namespace kvc_sim::internal

namespace sim = kvc_sim::internal;
using sim::Fail;
using sim::Kind;

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error (cudasim)";
    case cudaErrorInvalidValue:
      return "invalid argument (cudasim)";
    case cudaErrorMemoryAllocation:
      return "out of memory (cudasim)";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument (cudasim)";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal (cudasim)";
    case cudaErrorDeviceUninitialized:
      return "invalid device context (cudasim)";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle (cudasim)";
    case cudaErrorNotReady:
      return "device not ready (cudasim)";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (cudasim)";
  }
  return "unknown error (cudasim)";
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = sim::t_last_error;
  sim::t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return sim::t_last_error; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : Fail(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "cudasim (host)");
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = sim::Mem().capacity;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  if (attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return Fail(cudaErrorInvalidValue);
  *value = 227 * 1024;  // sm_90
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  sim::Memory& m = sim::Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  *free_bytes = m.capacity - m.used;
  *total_bytes = m.capacity;
  return cudaSuccess;
}

// Fresh device memory reads as zeros (new pages); cudaMallocAsync's as 0xff garbage.
cudaError_t cudaMalloc(void** p, size_t bytes) {
  return Fail(sim::MapRegion(p, bytes, /*device=*/true));
}
// CUDA's cudaFree waits for the device to be idle: queued work that still uses the memory
// runs first.
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> device(sim::DeviceMutex());
  sim::DrainLocked(/*target=*/nullptr, /*report=*/false);
  return Fail(sim::UnmapRegion(p, /*device=*/true));
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  const cudaError_t e = sim::MapRegion(p, bytes, /*device=*/true);
  if (e != cudaSuccess) return Fail(e);
  void* q = *p;
  sim::Enqueue(s, [q, bytes] {  // fresh scratch is garbage on a device too
    std::memset(q, 0xff, bytes);
    return cudaSuccess;
  });
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (p == nullptr) return cudaSuccess;
  CUstream_st* s = nullptr;
  if (sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  sim::Enqueue(s, [p] { return sim::UnmapRegion(p, /*device=*/true); });
  return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p) {
  if (handle == nullptr || p == nullptr) return Fail(cudaErrorInvalidValue);
  return Fail(sim::IpcExport(p, handle));
}
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle, unsigned flags) {
  if (p == nullptr || (flags & ~cudaIpcMemLazyEnablePeerAccess) != 0) {
    return Fail(cudaErrorInvalidValue);
  }
  return Fail(sim::IpcOpen(handle, p));
}
// As cudaFree: queued work that may still read the mapping runs first.
cudaError_t cudaIpcCloseMemHandle(void* p) {
  if (p == nullptr) return Fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> device(sim::DeviceMutex());
  sim::DrainLocked(/*target=*/nullptr, /*report=*/false);
  return Fail(sim::UnmapRegion(p, /*device=*/true, /*imported=*/true));
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return Fail(sim::MapRegion(p, bytes, /*device=*/false));
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags) {
  if (flags != cudaHostAllocDefault) return Fail(cudaErrorInvalidValue);  // not modelled
  return cudaMallocHost(p, bytes);
}
// Like cudaFree, waits for queued work (which may still copy from or to it).
cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> device(sim::DeviceMutex());
  sim::DrainLocked(/*target=*/nullptr, /*report=*/false);
  return Fail(sim::UnmapRegion(p, /*device=*/false));
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  if (attr == nullptr) return Fail(cudaErrorInvalidValue);
  Kind kind = Kind::kPageable;
  sim::Classify(p, 0, &kind);
  void* q = const_cast<void*>(p);
  switch (kind) {
    case Kind::kDevice:
      *attr = cudaPointerAttributes{cudaMemoryTypeDevice, 0, q, nullptr};
      break;
    case Kind::kPinned:
      *attr = cudaPointerAttributes{cudaMemoryTypeHost, 0, q, q};
      break;
    case Kind::kPageable:
      *attr = cudaPointerAttributes{cudaMemoryTypeUnregistered, cudaInvalidDeviceId, nullptr, q};
      break;
  }
  return cudaSuccess;
}

// Queues a copy on `stream`. Pageable host sources are staged now (CUDA copies them before
// the call returns); pinned sources and every destination are accessed when the copy
// executes, so a host that reuses a pinned buffer, or reads a result, before synchronizing
// sees what a GPU could give it.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Fail(cudaErrorInvalidValue);
  Kind dk, sk;
  if (!sim::Classify(dst, bytes, &dk) || !sim::Classify(src, bytes, &sk))
    return Fail(cudaErrorInvalidValue);  // runs past the end of a device allocation
  const bool dd = dk == Kind::kDevice, sd = sk == Kind::kDevice;
  const bool ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToHost && !dd && !sd) ||
                  (kind == cudaMemcpyHostToDevice && dd && !sd) ||
                  (kind == cudaMemcpyDeviceToHost && !dd && sd) ||
                  (kind == cudaMemcpyDeviceToDevice && dd && sd);
  if (!ok) return Fail(cudaErrorInvalidValue);
  if (sk == Kind::kPageable) {
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
    sim::Enqueue(s, [dst, staged] {
      std::memcpy(dst, staged->data(), staged->size());
      return cudaSuccess;
    });
  } else {
    sim::Enqueue(s, [dst, src, bytes] {
      std::memmove(dst, src, bytes);
      return cudaSuccess;
    });
  }
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  Kind kind;
  if (!sim::Classify(p, bytes, &kind) || kind != Kind::kDevice) return Fail(cudaErrorInvalidValue);
  sim::Enqueue(s, [p, value, bytes] {
    std::memset(p, value, bytes);
    return cudaSuccess;
  });
  return cudaSuccess;
}
// The blocking forms run on the legacy default stream and wait for it (and so for all
// earlier work of blocking streams), returning earlier asynchronous errors as CUDA does.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, /*s=*/nullptr);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  const cudaError_t e = cudaMemsetAsync(p, value, bytes, /*s=*/nullptr);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  return Fail(sim::Drain(s, /*report=*/true));
}
cudaError_t cudaDeviceSynchronize() {
  return Fail(sim::Drain(/*target=*/nullptr, /*report=*/true));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0)
    return Fail(cudaErrorInvalidValue);
  auto* s = new CUstream_st;
  s->flags = flags;
  sim::Queues& q = sim::Q();
  std::lock_guard<std::mutex> lock(q.mu);
  q.live.insert(s);
  *stream = s;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}
// CUDA lets queued work finish after the stream is destroyed; here it runs first.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (stream == nullptr || sim::Resolve(stream, &s) != cudaSuccess)
    return Fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> device(sim::DeviceMutex());
  sim::DrainLocked(s, /*report=*/false);
  sim::Queues& q = sim::Q();
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.live.erase(s);
  }
  delete s;
  return cudaSuccess;
}
// A stream with queued work is "not ready" once, and its work runs then: a host that polls
// makes progress, and a single query never finds queued work already done.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  {
    sim::Queues& q = sim::Q();
    std::lock_guard<std::mutex> lock(q.mu);
    if (s->queue.empty() && s->in_flight == 0) {
      const cudaError_t e = s->error;
      s->error = cudaSuccess;
      return Fail(e);
    }
  }
  sim::Drain(s, /*report=*/false);
  return cudaErrorNotReady;
}
