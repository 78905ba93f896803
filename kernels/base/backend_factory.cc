// The one place that knows which backends this build contains.
#include <cstdlib>
#include <memory>

#include "kvc/kernels/backend.h"

namespace kvc::kernels {
namespace internal {
std::unique_ptr<KernelBackend> MakeReferenceBackend();
std::unique_ptr<KernelBackend> MakeCpuBackend(int num_threads);
#if defined(KVC_HAVE_CUDA) && KVC_HAVE_CUDA
KernelStatus MakeCudaBackend(const BackendOptions& options, std::unique_ptr<KernelBackend>* out);
#endif
}  // namespace internal

KernelStatus KernelBackend::AllocateHost(size_t bytes, void** out) {
  *out = nullptr;
  if (bytes == 0) return KernelStatus::Ok();
  *out = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (*out == nullptr)
    return KernelStatus{KernelStatusCode::kOutOfMemory, "host allocation failed"};
  return KernelStatus::Ok();
}

void KernelBackend::FreeHost(void* ptr) { std::free(ptr); }

KernelStatus KernelBackend::ExportIpcHandle(void* /*ptr*/, IpcMemHandle* /*out*/) {
  return KernelStatus::Unsupported("IPC handles exist for device memory only (a CUDA backend)");
}

KernelStatus KernelBackend::OpenIpcHandle(const IpcMemHandle& /*handle*/, void** out) {
  *out = nullptr;
  return KernelStatus::Unsupported("IPC handles exist for device memory only (a CUDA backend)");
}

bool CudaBackendCompiled() {
#if defined(KVC_HAVE_CUDA) && KVC_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

KernelStatus CreateBackend(BackendKind kind, const BackendOptions& options,
                           std::unique_ptr<KernelBackend>* out) {
  out->reset();
  switch (kind) {
    case BackendKind::kReference:
      *out = internal::MakeReferenceBackend();
      return KernelStatus::Ok();
    case BackendKind::kCpu:
      *out = internal::MakeCpuBackend(options.num_threads);
      return KernelStatus::Ok();
    case BackendKind::kCuda:
#if defined(KVC_HAVE_CUDA) && KVC_HAVE_CUDA
      return internal::MakeCudaBackend(options, out);
#else
      return KernelStatus::Unavailable("kvc_kernels was built without CUDA (nvcc not found)");
#endif
  }
  return KernelStatus::Invalid("unknown backend kind");
}

}  // namespace kvc::kernels
