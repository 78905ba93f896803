// The CUDA backend: device memory and stream plumbing through the CUDA runtime (linked
// statically, so a host without a driver still loads the binary and gets kUnavailable),
// scalar validation on the host, then the kernel launchers in the .cu files.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <utility>

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

// Every pointer an op dereferences on the device must be device memory: a host pointer that
// slips through a caller's staging faults on a GPU (or, with unified addressing, silently
// reads host memory over PCIe). The check asks the runtime about each pointer, so it is on in
// the simulator build (whose kernels could otherwise read host memory) and, on a GPU, with
// KVC_CUDA_CHECK_POINTERS=1 (tests/gpu/run_service_gpu.sh sets it).
bool PointerChecksOn() {
#if defined(KVC_CUDASIM) && KVC_CUDASIM
  return true;
#else
  static const bool kOn = [] {
    const char* v = std::getenv("KVC_CUDA_CHECK_POINTERS");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return kOn;
#endif
}

KernelStatus DevicePointers(std::initializer_list<std::pair<const char*, const void*>> pointers) {
  for (const auto& [what, p] : pointers) {
    if (p == nullptr) continue;
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) cudaGetLastError();
    if (e != cudaSuccess ||
        (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)) {
      return KernelStatus::Invalid(what);  // a static string: "<argument> is not device memory"
    }
  }
  return KernelStatus::Ok();
}

KernelStatus Pointers(const WriteTokensArgs& a) {
  return DevicePointers({{"arena is not device memory", a.arena.base},
                         {"keys is not device memory", a.keys},
                         {"values is not device memory", a.values},
                         {"dst_blocks is not device memory", a.dst_blocks},
                         {"dst_slots is not device memory", a.dst_slots}});
}
KernelStatus Pointers(const ReadTokensArgs& a) {
  return DevicePointers({{"arena is not device memory", a.arena.base},
                         {"keys is not device memory", a.keys},
                         {"values is not device memory", a.values},
                         {"src_blocks is not device memory", a.src_blocks},
                         {"src_slots is not device memory", a.src_slots}});
}
KernelStatus Pointers(const ReadRecordsArgs& a) {
  return DevicePointers({{"arena is not device memory", a.arena.base},
                         {"keys is not device memory", a.keys},
                         {"values is not device memory", a.values},
                         {"src_blocks is not device memory", a.src_blocks},
                         {"src_slots is not device memory", a.src_slots}});
}
KernelStatus Pointers(const GatherArgs& a) {
  return DevicePointers({{"src arena is not device memory", a.src.base},
                         {"dst arena is not device memory", a.dst.base},
                         {"src_blocks is not device memory", a.src_blocks},
                         {"src_slots is not device memory", a.src_slots},
                         {"dst_blocks is not device memory", a.dst_blocks},
                         {"dst_slots is not device memory", a.dst_slots}});
}
KernelStatus Pointers(const RerotateArgs& a) {
  return DevicePointers({{"arena is not device memory", a.arena.base},
                         {"blocks is not device memory", a.blocks},
                         {"slots is not device memory", a.slots},
                         {"deltas is not device memory", a.deltas}});
}
KernelStatus Lanes(const LaneTable& l) {
  return DevicePointers({{"lanes.block_offsets is not device memory", l.block_offsets},
                         {"lanes.block_ids is not device memory", l.block_ids},
                         {"lanes.num_tokens is not device memory", l.num_tokens}});
}
KernelStatus Pointers(const SnapKvScoreArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(Lanes(a.lanes));
  return DevicePointers({{"arena is not device memory", a.arena.base},
                         {"queries is not device memory", a.queries},
                         {"query_positions is not device memory", a.query_positions},
                         {"key_positions is not device memory", a.key_positions},
                         {"scores is not device memory", a.scores}});
}
KernelStatus Pointers(const ExpectedAttentionScoreArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(Lanes(a.lanes));
  return DevicePointers({{"arena is not device memory", a.arena.base},
                         {"mean is not device memory", a.mean},
                         {"cov is not device memory", a.cov},
                         {"key_positions is not device memory", a.key_positions},
                         {"scores is not device memory", a.scores}});
}
KernelStatus Pointers(const AccumulateScoresArgs& a) {
  return DevicePointers({{"num_tokens is not device memory", a.num_tokens},
                         {"weights is not device memory", a.weights},
                         {"scores is not device memory", a.scores}});
}
KernelStatus Pointers(const SelectArgs& a) {
  return DevicePointers({{"num_tokens is not device memory", a.num_tokens},
                         {"positions is not device memory", a.positions},
                         {"scores is not device memory", a.scores},
                         {"budgets is not device memory", a.budgets},
                         {"keep is not device memory", a.keep}});
}
KernelStatus Pointers(const ChecksumBlocksArgs& a) {
  return DevicePointers({{"arena is not device memory", a.arena.base},
                         {"blocks is not device memory", a.blocks},
                         {"checksums is not device memory", a.checksums}});
}
KernelStatus Pointers(const AllocateBudgetsArgs& a) {
  return DevicePointers({{"num_tokens is not device memory", a.num_tokens},
                         {"positions is not device memory", a.positions},
                         {"scores is not device memory", a.scores},
                         {"totals is not device memory", a.totals},
                         {"budgets is not device memory", a.budgets}});
}
KernelStatus Pointers(const DecodeAttentionArgs& a) {
  KVC_KERNEL_RETURN_IF_ERROR(Lanes(a.lanes));
  return DevicePointers({{"arena is not device memory", a.arena.base},
                         {"queries is not device memory", a.queries},
                         {"out is not device memory", a.out},
                         {"weights is not device memory", a.weights},
                         {"scores is not device memory", a.scores},
                         {"lse is not device memory", a.lse}});
}

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
  KernelStatus BindThread() override { return SetDevice(); }
  KernelStatus Synchronize(StreamHandle s) override {
    KVC_KERNEL_RETURN_IF_ERROR(SetDevice());
    return FromCuda(cudaStreamSynchronize(ToStream(s)));
  }

  KernelStatus CreateStream(StreamHandle* out) override {
    *out = StreamHandle{};
    KVC_KERNEL_RETURN_IF_ERROR(SetDevice());
    cudaStream_t stream = nullptr;
    // Non-blocking: a caller's stream never waits for work on the legacy default stream.
    KVC_KERNEL_RETURN_IF_ERROR(FromCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
    out->native = stream;
    return KernelStatus::Ok();
  }
  void DestroyStream(StreamHandle s) override {
    if (s.native != nullptr && SetDevice().ok()) cudaStreamDestroy(ToStream(s));
  }
  KernelStatus AllocateHost(size_t bytes, void** out) override {
    *out = nullptr;
    if (bytes == 0) return KernelStatus::Ok();
    const cudaError_t e = cudaMallocHost(out, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      *out = nullptr;
      return KernelStatus{KernelStatusCode::kOutOfMemory, cudaGetErrorString(e)};
    }
    return KernelStatus::Ok();
  }
  void FreeHost(void* ptr) override {
    if (ptr != nullptr) cudaFreeHost(ptr);
  }

  KernelStatus ExportIpcHandle(void* ptr, IpcMemHandle* out) override {
    static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(IpcMemHandle::bytes));
    KVC_KERNEL_RETURN_IF_ERROR(SetDevice());
    cudaIpcMemHandle_t h{};
    KVC_KERNEL_RETURN_IF_ERROR(FromCuda(cudaIpcGetMemHandle(&h, ptr)));
    std::memcpy(out->bytes, &h, sizeof(h));
    return KernelStatus::Ok();
  }
  KernelStatus OpenIpcHandle(const IpcMemHandle& handle, void** out) override {
    *out = nullptr;
    KVC_KERNEL_RETURN_IF_ERROR(SetDevice());
    cudaIpcMemHandle_t h{};
    std::memcpy(&h, handle.bytes, sizeof(h));
    // Lazy peer access: the exporter's device may be another GPU of this machine.
    return FromCuda(cudaIpcOpenMemHandle(out, h, cudaIpcMemLazyEnablePeerAccess));
  }
  void CloseIpcHandle(void* ptr) override {
    if (ptr != nullptr && SetDevice().ok()) cudaIpcCloseMemHandle(ptr);
  }

#define KVC_CUDA_OP(Name, Args, Check)                        \
  KernelStatus Name(const Args& a, StreamHandle s) override { \
    KVC_KERNEL_RETURN_IF_ERROR(internal::Check(a));           \
    if (PointerChecksOn()) {                                  \
      KVC_KERNEL_RETURN_IF_ERROR(Pointers(a));                \
    }                                                         \
    KVC_KERNEL_RETURN_IF_ERROR(SetDevice());                  \
    return cuda::Launch##Name(a, s);                          \
  }
  KVC_CUDA_OP(WriteTokens, WriteTokensArgs, CheckWrite)
  KVC_CUDA_OP(ReadTokens, ReadTokensArgs, CheckRead)
  KVC_CUDA_OP(ReadRecords, ReadRecordsArgs, CheckReadRecords)
  KVC_CUDA_OP(Gather, GatherArgs, CheckGather)
  KVC_CUDA_OP(Rerotate, RerotateArgs, CheckRerotate)
  KVC_CUDA_OP(ChecksumBlocks, ChecksumBlocksArgs, CheckChecksumBlocks)
  KVC_CUDA_OP(SnapKvScore, SnapKvScoreArgs, CheckSnapKv)
  KVC_CUDA_OP(ExpectedAttentionScore, ExpectedAttentionScoreArgs, CheckExpectedAttention)
  KVC_CUDA_OP(AccumulateScores, AccumulateScoresArgs, CheckAccumulate)
  KVC_CUDA_OP(Select, SelectArgs, CheckSelect)
  KVC_CUDA_OP(AllocateBudgets, AllocateBudgetsArgs, CheckAllocateBudgets)
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
