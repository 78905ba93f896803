// BackendBuffer: memory of a kernel backend (host memory for host backends, device memory
// for CUDA), returned to it on destruction. Move-only.
#pragma once

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc/kernels/backend.h"

namespace kvc::cachesvc {

class BackendBuffer {
 public:
  // RESOURCE_EXHAUSTED when the backend cannot provide `bytes`.
  static absl::StatusOr<BackendBuffer> Allocate(kernels::KernelBackend* backend, size_t bytes) {
    void* p = nullptr;
    if (bytes > 0) {
      const kernels::KernelStatus ks = backend->Allocate(bytes, &p);
      if (!ks.ok()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", bytes, " bytes of scratch memory: ", ks.detail));
      }
    }
    return BackendBuffer(backend, p);
  }

  // Takes ownership of `data`, memory `backend` allocated.
  static BackendBuffer Adopt(kernels::KernelBackend* backend, void* data) {
    return BackendBuffer(backend, data);
  }

  BackendBuffer(BackendBuffer&& o) noexcept
      : backend_(o.backend_), data_(std::exchange(o.data_, nullptr)) {}
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      backend_ = o.backend_;
      data_ = std::exchange(o.data_, nullptr);
    }
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() { Reset(); }

  void* data() const { return data_; }

 private:
  BackendBuffer(kernels::KernelBackend* backend, void* data) : backend_(backend), data_(data) {}
  void Reset() {
    if (data_ != nullptr) backend_->Free(data_);
    data_ = nullptr;
  }

  kernels::KernelBackend* backend_;
  void* data_;
};

}  // namespace kvc::cachesvc
