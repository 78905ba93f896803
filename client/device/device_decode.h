// The device half of reading a lease into an engine's GPU buffers, shared by the same-node
// reader (kvc/client/device_reader.h: the records in the pool's memory, opened over CUDA IPC)
// and the NCCL reader (kvc/client/nccl_link.h: the records received into device memory,
// renumbered): check the buffers against the lease, then decode every leased record with
// the kernels' ReadTokens, the code the service decodes with. Internal to kvc::client_device.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kvc/client/kv_cache_client.h"
#include "kvc/client/types.h"
#include "kvc/kernels/backend.h"

namespace kvc::client::internal {

// The kernels' status as an absl::Status prefixed with what was being done.
absl::Status FromKernel(const kernels::KernelStatus& ks, const std::string& what);

#define KVC_RETURN_IF_KERNEL_ERROR(expr, what)                                  \
  do {                                                                          \
    const ::kvc::kernels::KernelStatus kvc_ks = (expr);                         \
    if (!kvc_ks.ok()) return ::kvc::client::internal::FromKernel(kvc_ks, what); \
  } while (0)

// What FetchInto can check before asking the server anything; the buffers' layers.
absl::StatusOr<std::vector<int32_t>> CheckDeviceBuffers(const std::vector<LayerBuffers>& buffers,
                                                        const FetchIntoOptions& options);

// Where one storage format's blocks lie in this process: block b of `lease` at base + b *
// block_bytes, b < num_blocks.
struct DeviceArena {
  const void* base = nullptr;
  int64_t num_blocks = 0;
};

// Decodes `lease`'s records (each lane's below the visible tokens, or the layer's with
// include_unfinished) into `buffers` on `backend`'s device and waits for it. The lease's
// block ids index arena_of(format). INVALID_ARGUMENT / OUT_OF_RANGE for buffers that do not
// fit, before anything is written; INTERNAL for a lease whose layout or blocks do not fit
// this client.
absl::StatusOr<FetchIntoResult> DecodeOnDevice(
    const Lease& lease, const std::function<DeviceArena(StorageFormat)>& arena_of,
    kernels::KernelBackend* backend, const std::vector<LayerBuffers>& buffers,
    const FetchIntoOptions& options);

// Device memory, freed with it.
class Scratch {
 public:
  explicit Scratch(kernels::KernelBackend* backend) : backend_(backend) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { backend_->Free(ptr_); }
  kernels::KernelStatus Allocate(size_t bytes) {
    backend_->Free(ptr_);
    ptr_ = nullptr;
    return backend_->Allocate(bytes, &ptr_);
  }
  void* get() const { return ptr_; }

 private:
  kernels::KernelBackend* backend_;
  void* ptr_ = nullptr;
};

// Ends a lease when the read is over, on every path (best effort: the TTL ends it otherwise).
class LeaseRelease {
 public:
  LeaseRelease(KvCacheClient* client, std::string id, const CallOptions& call)
      : client_(client), id_(std::move(id)), call_(call) {}
  LeaseRelease(const LeaseRelease&) = delete;
  LeaseRelease& operator=(const LeaseRelease&) = delete;
  ~LeaseRelease() { (void)client_->ReleaseLease(id_, call_); }

 private:
  KvCacheClient* client_;
  std::string id_;
  CallOptions call_;
};

}  // namespace kvc::client::internal
