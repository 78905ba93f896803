// The op-granular kernel interface the service calls, and the factory for its backends.
// Ops return a KernelStatus and never throw. Host backends (kReference, kCpu) run ops
// synchronously; kCuda enqueues them on the given stream and reports launch errors only
// (call Synchronize to see execution errors and before reading results on the host).
#pragma once

#include <cstddef>
#include <memory>

#include "kvc/kernels/ops.h"
#include "kvc/kernels/status.h"

namespace kvc::kernels {

enum class BackendKind : uint8_t {
  kReference = 0,  // slow, obvious scalar code: the specification
  kCpu = 1,        // multi-threaded, vectorizable; the service's backend without a GPU
  kCuda = 2,       // CUDA kernels, sm_80+; available when built with nvcc and a device exists
};

constexpr const char* BackendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kReference:
      return "reference";
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCuda:
      return "cuda";
  }
  return "?";
}

// An allocation exported for other processes on this machine: CUDA's cudaIpcMemHandle_t, 64
// opaque bytes. Anyone who holds it can open the allocation (with access to the device), so
// it is handed out only over a channel that checks who asks.
struct IpcMemHandle {
  unsigned char bytes[64] = {};
};

struct BackendOptions {
  int num_threads = 0;  // kCpu: worker threads; 0 means std::thread::hardware_concurrency
  int device = 0;       // kCuda: device ordinal
};

class KernelBackend {
 public:
  virtual ~KernelBackend() = default;

  virtual BackendKind kind() const = 0;
  virtual const char* name() const = 0;

  // Memory the backend's ops can use: 64-byte aligned host memory for host backends, device
  // memory for CUDA. Free(nullptr) is a no-op.
  virtual KernelStatus Allocate(size_t bytes, void** out) = 0;
  virtual void Free(void* ptr) = 0;
  virtual KernelStatus CopyToDevice(void* dst, const void* host_src, size_t bytes,
                                    StreamHandle stream) = 0;
  virtual KernelStatus CopyToHost(void* host_dst, const void* src, size_t bytes,
                                  StreamHandle stream) = 0;
  virtual KernelStatus CopyOnDevice(void* dst, const void* src, size_t bytes,
                                    StreamHandle stream) = 0;
  virtual KernelStatus Memset(void* dst, int value, size_t bytes, StreamHandle stream) = 0;
  virtual KernelStatus Synchronize(StreamHandle stream) = 0;

  // A stream of its own for a caller that runs ops concurrently with others (CUDA: a
  // non-blocking stream on the backend's device). Host backends run ops synchronously and
  // hand out the null stream. Destroy it with DestroyStream once its work is synchronized.
  virtual KernelStatus CreateStream(StreamHandle* out) {
    *out = StreamHandle{};
    return KernelStatus::Ok();
  }
  virtual void DestroyStream(StreamHandle /*stream*/) {}
  // Makes this backend's device the calling thread's current one (CUDA: cudaSetDevice), for
  // libraries that act on the current device, such as NCCL. Host backends: nothing to do.
  virtual KernelStatus BindThread() { return KernelStatus::Ok(); }
  // Host memory for staging copies: page-locked for CUDA, so CopyToDevice/CopyToHost on it
  // are truly asynchronous (and the host must not touch it until Synchronize); ordinary
  // 64-byte aligned memory for host backends. FreeHost(nullptr) is a no-op.
  virtual KernelStatus AllocateHost(size_t bytes, void** out);
  virtual void FreeHost(void* ptr);

  // Cross-process sharing of device memory (CUDA IPC). ExportIpcHandle: a handle to the
  // allocation that starts at `ptr` (as Allocate returned it). OpenIpcHandle: maps another
  // process's exported allocation into this one (*out: its start); the exporting process
  // itself cannot open its own handle (CUDA refuses). CloseIpcHandle unmaps what
  // OpenIpcHandle mapped. Host backends: kUnsupported (their memory is shared as memfds).
  virtual KernelStatus ExportIpcHandle(void* ptr, IpcMemHandle* out);
  virtual KernelStatus OpenIpcHandle(const IpcMemHandle& handle, void** out);
  virtual void CloseIpcHandle(void* /*ptr*/) {}

  virtual KernelStatus WriteTokens(const WriteTokensArgs& args, StreamHandle stream) = 0;
  virtual KernelStatus ReadTokens(const ReadTokensArgs& args, StreamHandle stream) = 0;
  virtual KernelStatus ReadRecords(const ReadRecordsArgs& args, StreamHandle stream) = 0;
  virtual KernelStatus Gather(const GatherArgs& args, StreamHandle stream) = 0;
  virtual KernelStatus Rerotate(const RerotateArgs& args, StreamHandle stream) = 0;
  virtual KernelStatus ChecksumBlocks(const ChecksumBlocksArgs& args, StreamHandle stream) = 0;
  virtual KernelStatus SnapKvScore(const SnapKvScoreArgs& args, StreamHandle stream) = 0;
  virtual KernelStatus ExpectedAttentionScore(const ExpectedAttentionScoreArgs& args,
                                              StreamHandle stream) = 0;
  virtual KernelStatus AccumulateScores(const AccumulateScoresArgs& args, StreamHandle stream) = 0;
  virtual KernelStatus Select(const SelectArgs& args, StreamHandle stream) = 0;
  virtual KernelStatus AllocateBudgets(const AllocateBudgetsArgs& args, StreamHandle stream) = 0;
  virtual KernelStatus DecodeAttention(const DecodeAttentionArgs& args, StreamHandle stream) = 0;
};

// Creates a backend. kCuda gives kUnavailable when the library was built without CUDA or no
// usable device/driver is present (the detail says which); *out is then null.
KernelStatus CreateBackend(BackendKind kind, const BackendOptions& options,
                           std::unique_ptr<KernelBackend>* out);

// True when this build contains the CUDA backend (a device may still be missing).
bool CudaBackendCompiled();

}  // namespace kvc::kernels
