#include "kvc/client/device_reader.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/device/device_decode.h"
#include "client/src/kernel_types.h"
#include "client/src/transfer_rpcs.h"
#include "common/mutex.h"
#include "kvc/kernels/backend.h"
#include "kvc/kernels/block_layout.h"

namespace kvc::client {

namespace {

// One CUDA device's backend, and the pools opened on it.
struct Device {
  std::unique_ptr<kernels::KernelBackend> backend;
};

struct OpenPool {
  kernels::KernelBackend* backend = nullptr;
  void* base = nullptr;
  int64_t bytes = 0;
  int32_t device = -1;
};

}  // namespace

struct DeviceReader::Impl {
  KvCacheClient* client = nullptr;
  kvc::Mutex mu;
  std::map<int32_t, Device> devices ABSL_GUARDED_BY(mu);
  std::map<std::string, OpenPool> pools ABSL_GUARDED_BY(mu);  // by "<server token>/<pool>"

  // The pool of `lease`, opened on first use on its device. The handle is asked for every
  // time (one local-socket round trip): the lease must be of the server whose memory the
  // handle opens, and after a restart the same pool name is another allocation.
  absl::StatusOr<OpenPool> Open(const Lease& lease, const CallOptions& call) {
    int32_t ordinal = -1;
    if (!absl::StartsWith(lease.device, "cuda:") ||
        !absl::SimpleAtoi(lease.device.substr(5), &ordinal) || ordinal < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", lease.sequence_id, " is in pool '", lease.pool, "' on ", lease.device,
          ", not on a CUDA device (KvCacheClient::FetchInto reads host pools)"));
    }
    const StorageFormat any = lease.arenas.empty() ? StorageFormat::kF16 : lease.arenas[0].format;
    absl::StatusOr<DeviceArenaHandle> handle =
        internal::ShareDeviceArena(*client, lease.pool, any, call);
    if (!handle.ok()) return handle.status();
    if (handle->server_token != lease.local_token) {
      return absl::AbortedError(
          "the lease is from another server than the local socket's (it restarted?); fetch "
          "again");
    }
    if (handle->device != ordinal) {
      return absl::InternalError(absl::StrCat("the lease says ", lease.device,
                                              " but the server shared cuda:", handle->device));
    }
    const std::string key = absl::StrCat(handle->server_token, "/", lease.pool);
    kvc::MutexLock lock(&mu);
    if (auto it = pools.find(key); it != pools.end()) return it->second;
    Device& dev = devices[ordinal];
    if (dev.backend == nullptr) {
      kernels::BackendOptions options;
      options.device = ordinal;
      const kernels::KernelStatus ks =
          kernels::CreateBackend(kernels::BackendKind::kCuda, options, &dev.backend);
      if (!ks.ok()) {
        devices.erase(ordinal);
        return absl::UnavailableError(
            absl::StrCat("no CUDA backend for ", lease.device, " in this process: ", ks.detail));
      }
    }
    kernels::IpcMemHandle ipc;
    std::memcpy(ipc.bytes, handle->cuda_ipc.data(), sizeof(ipc.bytes));
    OpenPool pool;
    pool.backend = dev.backend.get();
    pool.bytes = handle->bytes;
    pool.device = ordinal;
    KVC_RETURN_IF_KERNEL_ERROR(
        dev.backend->OpenIpcHandle(ipc, &pool.base),
        absl::StrCat("cannot open pool '", lease.pool, "' of ", lease.device, " (CUDA IPC)"));
    // An earlier server's mapping of this pool stays open until the reader goes: a call of
    // another thread may still read through it.
    pools[key] = pool;
    return pool;
  }
};

absl::StatusOr<std::unique_ptr<DeviceReader>> DeviceReader::Create(KvCacheClient* client) {
  if (!kernels::CudaBackendCompiled()) {
    return absl::UnavailableError("this build of the kvcache client has no CUDA backend");
  }
  auto impl = std::make_unique<Impl>();
  impl->client = client;
  return std::unique_ptr<DeviceReader>(new DeviceReader(std::move(impl)));
}

DeviceReader::DeviceReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DeviceReader::~DeviceReader() {
  kvc::MutexLock lock(&impl_->mu);
  for (auto& [name, pool] : impl_->pools) pool.backend->CloseIpcHandle(pool.base);
}

absl::StatusOr<const void*> DeviceReader::PoolBase(const Lease& lease, const CallOptions& call) {
  absl::StatusOr<OpenPool> pool = impl_->Open(lease, call);
  if (!pool.ok()) return pool.status();
  return static_cast<const void*>(pool->base);
}

absl::StatusOr<FetchIntoResult> DeviceReader::FetchInto(const std::string& sequence_id,
                                                        const std::vector<LayerBuffers>& buffers,
                                                        const FetchIntoOptions& options,
                                                        const CallOptions& call) {
  absl::StatusOr<std::vector<int32_t>> layers = internal::CheckDeviceBuffers(buffers, options);
  if (!layers.ok()) return layers.status();
  absl::StatusOr<Lease> lease =
      impl_->client->LeaseSequence(sequence_id, *layers, absl::ZeroDuration(), call);
  if (!lease.ok()) return lease.status();
  // Ending the lease is best effort on every path: if that call fails, the TTL ends it.
  const internal::LeaseRelease release(impl_->client, lease->lease_id, call);
  absl::StatusOr<OpenPool> pool = impl_->Open(*lease, call);
  if (!pool.ok()) return pool.status();
  absl::StatusOr<FetchIntoResult> result = internal::DecodeOnDevice(
      *lease,
      [&](StorageFormat format) {
        const LeaseArena* a = lease->arena(format);
        return internal::DeviceArena{
            pool->base, a == nullptr || a->block_bytes <= 0 ? 0 : pool->bytes / a->block_bytes};
      },
      pool->backend, buffers, options);
  if (!result.ok()) return result.status();
  // A block of an expired lease may have been reused meanwhile: then nothing read counts.
  if (absl::ToUnixMillis(absl::Now()) >= lease->expires_unix_ms) {
    return absl::AbortedError("the lease expired while it was read; fetch again");
  }
  return result;
}

}  // namespace kvc::client
