// The CUDA backend: device memory and stream plumbing through the CUDA runtime (linked
// statically, so a host without a driver still loads the binary and gets kUnavailable),
// scalar validation on the host, then the kernel launchers in the .cu files.
#include <cuda_runtime.h>

#include <memory>

#include "base/validate.h"
#include "cuda/cuda_ops.h"
#include "kvc/kernels/backend.h"

namespace kvc::kernels {
namespace {

// A failed call's error is reported here, so it is also cleared from the thread's last error
// (else the next op's launch check would report it again; see cuda/cuda_common.cuh).
KernelStatus FromCuda(cudaError_t e) {
  if (e == cudaSuccess) return KernelStatus::Ok();
  cudaGetLastError();
  return KernelStatus::Internal(cudaGetErrorString(e));
}
cudaStream_t ToStream(StreamHandle s) { return static_cast<cudaStream_t>(s.native); }

class CudaBackend final : public KernelBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  BackendKind kind() const override { return BackendKind::kCuda; }
  const char* name() const override { return "cuda"; }

  KernelStatus Allocate(size_t bytes, void** out) override {
    *out = nullptr;
    if (bytes == 0) return KernelStatus::Ok();
    KVC_KERNEL_RETURN_IF_ERROR(SetDevice());
    const cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state
      return KernelStatus{KernelStatusCode::kOutOfMemory, cudaGetErrorString(e)};
    }
    return KernelStatus::Ok();
  }
  void Free(void* ptr) override {
    if (ptr != nullptr && SetDevice().ok()) cudaFree(ptr);
  }
  KernelStatus CopyToDevice(void* dst, const void* src, size_t bytes, StreamHandle s) override {
    return Copy(dst, src, bytes, cudaMemcpyHostToDevice, s);
  }
  KernelStatus CopyToHost(void* dst, const void* src, size_t bytes, StreamHandle s) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  }
  KernelStatus CopyOnDevice(void* dst, const void* src, size_t bytes, StreamHandle s) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  }
  KernelStatus Memset(void* dst, int value, size_t bytes, StreamHandle s) override {
    if (bytes == 0) return KernelStatus::Ok();
    KVC_KERNEL_RETURN_IF_ERROR(SetDevice());
    return FromCuda(cudaMemsetAsync(dst, value, bytes, ToStream(s)));
  }
  KernelStatus Synchronize(StreamHandle s) override {
    KVC_KERNEL_RETURN_IF_ERROR(SetDevice());
    return FromCuda(cudaStreamSynchronize(ToStream(s)));
  }

#define KVC_CUDA_OP(Name, Args, Check)                        \
  KernelStatus Name(const Args& a, StreamHandle s) override { \
    KVC_KERNEL_RETURN_IF_ERROR(internal::Check(a));           \
    KVC_KERNEL_RETURN_IF_ERROR(SetDevice());                  \
    return cuda::Launch##Name(a, s);                          \
  }
  KVC_CUDA_OP(WriteTokens, WriteTokensArgs, CheckWrite)
  KVC_CUDA_OP(ReadTokens, ReadTokensArgs, CheckRead)
  KVC_CUDA_OP(ReadRecords, ReadRecordsArgs, CheckReadRecords)
  KVC_CUDA_OP(Gather, GatherArgs, CheckGather)
  KVC_CUDA_OP(Rerotate, RerotateArgs, CheckRerotate)
  KVC_CUDA_OP(SnapKvScore, SnapKvScoreArgs, CheckSnapKv)
  KVC_CUDA_OP(AccumulateScores, AccumulateScoresArgs, CheckAccumulate)
  KVC_CUDA_OP(Select, SelectArgs, CheckSelect)
  KVC_CUDA_OP(DecodeAttention, DecodeAttentionArgs, CheckDecode)
#undef KVC_CUDA_OP

 private:
  KernelStatus SetDevice() { return FromCuda(cudaSetDevice(device_)); }
  KernelStatus Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, StreamHandle s) {
    if (bytes == 0) return KernelStatus::Ok();
    KVC_KERNEL_RETURN_IF_ERROR(SetDevice());
    return FromCuda(cudaMemcpyAsync(dst, src, bytes, kind, ToStream(s)));
  }

  int device_;
};

}  // namespace

namespace internal {

KernelStatus MakeCudaBackend(const BackendOptions& options, std::unique_ptr<KernelBackend>* out) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return KernelStatus::Unavailable(cudaGetErrorString(e));
  }
  if (options.device < 0 || options.device >= count)
    return KernelStatus::Unavailable("no such CUDA device");
  cudaDeviceProp prop;
  KVC_KERNEL_RETURN_IF_ERROR(FromCuda(cudaGetDeviceProperties(&prop, options.device)));
  if (prop.major < 8)
    return KernelStatus::Unavailable("CUDA backend needs compute capability 8.0 or newer");
  *out = std::make_unique<CudaBackend>(options.device);
  return KernelStatus::Ok();
}

}  // namespace internal
}  // namespace kvc::kernels
