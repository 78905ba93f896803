// Plumbing shared by the real-GPU programs in tests/gpu (kvc_gpu_bench, kvc_longctx_demo):
// checked CUDA calls, owned device buffers, cudaEvent timing (median of N after warm-up), a
// device-side synthetic KV generator and a tiny JSON writer. Kernels-level only: no gRPC,
// no GoogleTest, so these build in the standalone kernels/ build on a bare GPU box.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kvc/kernels/backend.h"
#include "kvc/kernels/dtype.h"

namespace kvc::gpu {

// Every CUDA runtime call goes through here: a failure is printed with the call's text and
// turned into `false`, so callers stop at the first error instead of timing garbage.
inline bool CudaOk(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "CUDA error at %s:%d: %s: %s\n", file, line, what, cudaGetErrorString(e));
  cudaGetLastError();  // clear a non-sticky error so the next check reports its own call
  return false;
}
#define KVC_CUDA_OK(call) ::kvc::gpu::CudaOk((call), #call, __FILE__, __LINE__)

inline bool KernelOk(const kernels::KernelStatus& st, const char* what) {
  if (st.ok()) return true;
  std::fprintf(stderr, "kernel op %s failed: %s: %s\n", what,
               kernels::KernelStatusCodeName(st.code), st.detail);
  return false;
}

// The "is there a GPU" decision every program makes first. False with a reason when the
// runtime finds no usable device (no driver, no device, too old); the caller prints SKIP.
inline bool ProbeDevice(int device, std::string* reason, cudaDeviceProp* prop) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *reason = cudaGetErrorString(e);
    return false;
  }
  if (device < 0 || device >= count) {
    *reason =
        "device " + std::to_string(device) + " not present (" + std::to_string(count) + " devices)";
    return false;
  }
  if (!KVC_CUDA_OK(cudaGetDeviceProperties(prop, device)) || !KVC_CUDA_OK(cudaSetDevice(device))) {
    *reason = "cudaGetDeviceProperties/cudaSetDevice failed";
    return false;
  }
  if (prop->major < 8) {
    *reason = "compute capability " + std::to_string(prop->major) + "." +
              std::to_string(prop->minor) + " < 8.0";
    return false;
  }
  return true;
}

// One cudaMalloc, freed (and the free checked) with its owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }
  bool Allocate(size_t bytes, const char* what) {
    Reset();
    if (!KVC_CUDA_OK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 256)))) {
      std::fprintf(stderr, "  (allocating %s: %.3f GiB)\n", what, bytes / 1073741824.0);
      ptr_ = nullptr;
      return false;
    }
    bytes_ = bytes;
    return true;
  }
  void Reset() {
    if (ptr_ != nullptr) KVC_CUDA_OK(cudaFree(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
bool Upload(DeviceBuffer* buf, const std::vector<T>& v, const char* what) {
  return buf->Allocate(v.size() * sizeof(T), what) &&
         KVC_CUDA_OK(
             cudaMemcpy(buf->get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// Times `op` (which enqueues work on the legacy default stream, as the kernel backend does
// for StreamHandle{}) with cudaEvents: `warmup` untimed runs, then `reps` runs timed one by
// one; returns the median in milliseconds, or a negative value after an error.
inline double MedianMs(const std::function<bool()>& op, int warmup, int reps) {
  cudaEvent_t start = nullptr, stop = nullptr;
  if (!KVC_CUDA_OK(cudaEventCreate(&start))) return -1;
  if (!KVC_CUDA_OK(cudaEventCreate(&stop))) {
    cudaEventDestroy(start);
    return -1;
  }
  std::vector<float> ms;
  bool ok = true;
  for (int i = 0; i < warmup && ok; ++i) ok = op();
  ok = ok && KVC_CUDA_OK(cudaDeviceSynchronize());
  for (int i = 0; i < reps && ok; ++i) {
    float t = 0;
    ok = KVC_CUDA_OK(cudaEventRecord(start, nullptr)) && op() &&
         KVC_CUDA_OK(cudaEventRecord(stop, nullptr)) && KVC_CUDA_OK(cudaEventSynchronize(stop)) &&
         KVC_CUDA_OK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  KVC_CUDA_OK(cudaEventDestroy(start));
  KVC_CUDA_OK(cudaEventDestroy(stop));
  if (!ok || ms.empty()) return -1;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Memory of any kernel backend (device memory for CUDA, aligned host memory for the CPU
// backend), freed with its owner: lets a program run its logic on the CPU backend too, so
// that it is exercised on machines without a GPU.
class BackendBuffer {
 public:
  explicit BackendBuffer(kernels::KernelBackend& b) : b_(b) {}
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() { Reset(); }
  bool Allocate(size_t bytes, const char* what) {
    Reset();
    const kernels::KernelStatus st = b_.Allocate(std::max<size_t>(bytes, 256), &ptr_);
    if (!st.ok()) {
      std::fprintf(stderr, "allocating %s (%.3f GiB) failed: %s\n", what, bytes / 1073741824.0,
                   st.detail);
      ptr_ = nullptr;
      return false;
    }
    return true;
  }
  template <typename T>
  bool Upload(const std::vector<T>& v, const char* what) {
    return Allocate(v.size() * sizeof(T), what) &&
           KernelOk(b_.CopyToDevice(ptr_, v.data(), v.size() * sizeof(T), kernels::StreamHandle{}),
                    what) &&
           KernelOk(b_.Synchronize(kernels::StreamHandle{}), what);
  }
  template <typename T>
  bool Download(std::vector<T>* v, const char* what) const {
    return KernelOk(b_.CopyToHost(v->data(), ptr_, v->size() * sizeof(T), kernels::StreamHandle{}),
                    what) &&
           KernelOk(b_.Synchronize(kernels::StreamHandle{}), what);
  }
  void Reset() {
    if (ptr_ != nullptr) b_.Free(ptr_);
    ptr_ = nullptr;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  kernels::KernelBackend& b_;
  void* ptr_ = nullptr;
};

// MedianMs for any backend: cudaEvents on CUDA, the steady clock around synchronous host ops.
inline double BackendMedianMs(kernels::KernelBackend& b, const std::function<bool()>& op,
                              int warmup, int reps) {
  if (b.kind() == kernels::BackendKind::kCuda) return MedianMs(op, warmup, reps);
  std::vector<double> ms;
  for (int i = 0; i < warmup; ++i)
    if (!op()) return -1;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!op() || !KernelOk(b.Synchronize(kernels::StreamHandle{}), "Synchronize")) return -1;
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  if (ms.empty()) return -1;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Copy bandwidth through the backend's own CopyOnDevice (cudaMemcpyAsync D2D, or memcpy),
// read + written bytes per second in GB/s; negative after an error.
inline double BackendCopyGbps(kernels::KernelBackend& b, size_t bytes, int warmup, int reps) {
  BackendBuffer src(b), dst(b);
  if (!src.Allocate(bytes, "copy source") || !dst.Allocate(bytes, "copy destination")) return -1;
  if (!KernelOk(b.Memset(src.get(), 1, bytes, kernels::StreamHandle{}), "Memset")) return -1;
  const double ms = BackendMedianMs(
      b,
      [&] {
        return KernelOk(b.CopyOnDevice(dst.get(), src.get(), bytes, kernels::StreamHandle{}),
                        "CopyOnDevice");
      },
      warmup, reps);
  return ms > 0 ? 2.0 * bytes / (ms * 1e-3) / 1e9 : -1;
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written (the convention of
// every ratio here): a cudaMemcpyAsync of `bytes` moves 2 * bytes. Returns GB/s (1e9), or a
// negative value after an error.
inline double CopyGbps(size_t bytes, int warmup, int reps) {
  DeviceBuffer src, dst;
  if (!src.Allocate(bytes, "copy source") || !dst.Allocate(bytes, "copy destination")) return -1;
  if (!KVC_CUDA_OK(cudaMemset(src.get(), 1, bytes))) return -1;
  const double ms = MedianMs(
      [&] {
        return KVC_CUDA_OK(
            cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, nullptr));
      },
      warmup, reps);
  return ms > 0 ? 2.0 * bytes / (ms * 1e-3) / 1e9 : -1;
}

// Deterministic hash noise (splitmix64), identical on host and device.
__host__ __device__ inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Uniform in [-1, 1).
__host__ __device__ inline float HashUniform(uint64_t key) {
  return static_cast<float>(static_cast<int64_t>(Mix64(key) >> 40) - (1ll << 23)) *
         (1.0f / (1 << 23));
}

// Fills `rows` f16 rows of `d` elements with HashUniform(seed, row, j) * amplitude.
__global__ void FillHalfKernel(uint16_t* out, int64_t rows, int d, uint64_t seed, float amplitude) {
  const int64_t n = rows * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = kernels::FloatToHalf(amplitude * HashUniform(seed * 0x100000001b3ull + i));
  }
}
inline bool FillHalf(void* out, int64_t rows, int d, uint64_t seed, float amplitude) {
  FillHalfKernel<<<1024, 256>>>(static_cast<uint16_t*>(out), rows, d, seed, amplitude);
  return KVC_CUDA_OK(cudaGetLastError());
}

// Destinations of `rows` consecutive tokens of one lane, starting at stored token t0: block
// lane_blocks[(t0 + r) / block_tokens], slot (t0 + r) % block_tokens.
__global__ void LaneSlotsKernel(const int32_t* lane_blocks, int block_tokens, int64_t t0,
                                int64_t rows, int32_t* blocks, int32_t* slots) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    blocks[r] = lane_blocks[(t0 + r) / block_tokens];
    slots[r] = static_cast<int32_t>((t0 + r) % block_tokens);
  }
}
inline bool LaneSlots(const int32_t* lane_blocks, int block_tokens, int64_t t0, int64_t rows,
                      int32_t* blocks, int32_t* slots) {
  LaneSlotsKernel<<<1024, 256>>>(lane_blocks, block_tokens, t0, rows, blocks, slots);
  return KVC_CUDA_OK(cudaGetLastError());
}

// FillHalf / LaneSlots for any backend: the kernels above on CUDA, the same formulas in a
// host loop for the CPU backend (whose memory is host memory).
inline bool FillHalfOn(kernels::KernelBackend& b, void* out, int64_t rows, int d, uint64_t seed,
                       float amplitude) {
  if (b.kind() == kernels::BackendKind::kCuda) return FillHalf(out, rows, d, seed, amplitude);
  uint16_t* o = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < rows * d; ++i)
    o[i] = kernels::FloatToHalf(amplitude * HashUniform(seed * 0x100000001b3ull + i));
  return true;
}
inline bool LaneSlotsOn(kernels::KernelBackend& b, const int32_t* lane_blocks, int block_tokens,
                        int64_t t0, int64_t rows, int32_t* blocks, int32_t* slots) {
  if (b.kind() == kernels::BackendKind::kCuda)
    return LaneSlots(lane_blocks, block_tokens, t0, rows, blocks, slots);
  for (int64_t r = 0; r < rows; ++r) {
    blocks[r] = lane_blocks[(t0 + r) / block_tokens];
    slots[r] = static_cast<int32_t>((t0 + r) % block_tokens);
  }
  return true;
}

// Minimal JSON object writer: enough for flat records and arrays of them.
class Json {
 public:
  Json& Key(const std::string& k) {
    Sep();
    out_ += "\"" + k + "\": ";
    need_comma_ = false;
    return *this;
  }
  Json& Str(const std::string& v) {
    Sep();
    out_ += "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') out_ += '\\';
      out_ += (c == '\n' ? ' ' : c);
    }
    out_ += "\"";
    need_comma_ = true;
    return *this;
  }
  Json& Num(double v) {
    Sep();
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    out_ += buf;
    need_comma_ = true;
    return *this;
  }
  Json& Bool(bool v) {
    Sep();
    out_ += v ? "true" : "false";
    need_comma_ = true;
    return *this;
  }
  Json& Open(char c) {
    Sep();
    out_ += c;
    need_comma_ = false;
    return *this;
  }
  Json& Close(char c) {
    out_ += c;
    need_comma_ = true;
    return *this;
  }
  const std::string& str() const { return out_; }
  bool WriteTo(const std::string& path) const {
    if (path.empty()) return true;
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return false;
    const bool ok =
        std::fwrite(out_.data(), 1, out_.size(), f) == out_.size() && std::fputc('\n', f) != EOF;
    return std::fclose(f) == 0 && ok;
  }

 private:
  void Sep() {
    if (need_comma_) out_ += ", ";
    need_comma_ = false;
  }
  std::string out_;
  bool need_comma_ = false;
};

// The SKIP line and file every program produces on a machine without a usable GPU.
inline int Skip(const std::string& reason, const std::string& json_path) {
  std::printf("SKIP: no CUDA device (%s)\n", reason.c_str());
  Json j;
  j.Open('{').Key("skipped").Str("no CUDA device (" + reason + ")").Close('}');
  if (!j.WriteTo(json_path)) std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
  return 0;
}

}  // namespace kvc::gpu
