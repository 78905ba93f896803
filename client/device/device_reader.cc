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
#include "client/src/kernel_types.h"
#include "common/mutex.h"
#include "kvc/kernels/backend.h"
#include "kvc/kernels/block_layout.h"

namespace kvc::client {

absl::Status FromKernel(const kernels::KernelStatus& ks, const std::string& what);

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

// Device memory of one call, freed with it.
class Scratch {
 public:
  explicit Scratch(kernels::KernelBackend* backend) : backend_(backend) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { backend_->Free(ptr_); }
  kernels::KernelStatus Allocate(size_t bytes) { return backend_->Allocate(bytes, &ptr_); }
  void* get() const { return ptr_; }

 private:
  kernels::KernelBackend* backend_;
  void* ptr_ = nullptr;
};

// A stream of one call, destroyed with it (after its work was synchronized or abandoned).
class Stream {
 public:
  explicit Stream(kernels::KernelBackend* backend) : backend_(backend) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (created_) {
      (void)backend_->Synchronize(handle_);
      backend_->DestroyStream(handle_);
    }
  }
  kernels::KernelStatus Create() {
    const kernels::KernelStatus ks = backend_->CreateStream(&handle_);
    created_ = ks.ok();
    return ks;
  }
  kernels::StreamHandle handle() const { return handle_; }

 private:
  kernels::KernelBackend* backend_;
  kernels::StreamHandle handle_;
  bool created_ = false;
};

}  // namespace

// The kernels' status as an absl::Status prefixed with what was being done.
absl::Status FromKernel(const kernels::KernelStatus& ks, const std::string& what) {
  if (ks.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", ks.detail);
  switch (ks.code) {
    case kernels::KernelStatusCode::kInvalidArgument:
      return absl::InvalidArgumentError(message);
    case kernels::KernelStatusCode::kUnavailable:
    case kernels::KernelStatusCode::kUnsupported:
      return absl::FailedPreconditionError(message);
    case kernels::KernelStatusCode::kOutOfMemory:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

namespace {

#define KVC_RETURN_IF_KERNEL_ERROR(expr, what)                        \
  do {                                                                \
    const ::kvc::kernels::KernelStatus kvc_ks = (expr);               \
    if (!kvc_ks.ok()) return ::kvc::client::FromKernel(kvc_ks, what); \
  } while (0)

size_t ElementBytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// The lease's description of `format`'s records, checked against the layout this client's
// kernels compute (the reads below trust it for every offset).
absl::StatusOr<kernels::BlockLayout> CheckedLayout(const Lease& lease, StorageFormat format) {
  const LeaseArena* a = lease.arena(format);
  if (a == nullptr) return absl::InternalError("the lease names no arena for a segment");
  const kernels::BlockLayout l =
      kernels::MakeBlockLayout(internal::KernelFormat(format), lease.head_dim, lease.block_tokens);
  if (static_cast<int64_t>(l.block_bytes) != a->block_bytes ||
      static_cast<int64_t>(l.record_bytes) != a->record_bytes ||
      static_cast<int64_t>(l.key_offset) != a->key_offset ||
      static_cast<int64_t>(l.value_offset) != a->value_offset) {
    return absl::InternalError(
        absl::StrCat("the server's layout of ", kernels::StorageFormatName(l.format),
                     " records differs from this client's (a different kvcache version?)"));
  }
  return l;
}

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

// One run of ReadTokens: `rows` rows of one lane's segment, from row `first` of the call's
// (block, slot) arrays, written at row `out_row` of the lane's buffers.
struct Piece {
  size_t lane = 0;
  StorageFormat format = StorageFormat::kPoolDefault;
  size_t first = 0;
  size_t rows = 0;
  size_t out_row = 0;
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
    absl::StatusOr<DeviceArenaHandle> handle = client->ShareDeviceArena(lease.pool, any, call);
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
  if (options.dtype != DType::kF16 && options.dtype != DType::kBF16 &&
      options.dtype != DType::kF32) {
    return absl::InvalidArgumentError("FetchInto: options.dtype must be F16, BF16 or F32");
  }
  if (options.num_kv_heads <= 0 || options.head_dim <= 0 || buffers.empty()) {
    return absl::InvalidArgumentError(
        "FetchInto: num_kv_heads, head_dim and the buffers must be given");
  }
  std::vector<int32_t> layers;
  for (const LayerBuffers& b : buffers) {
    if (b.keys == nullptr || b.values == nullptr || b.capacity_tokens < 0 ||
        std::find(layers.begin(), layers.end(), b.layer) != layers.end()) {
      return absl::InvalidArgumentError(absl::StrCat("FetchInto: the buffers of layer ", b.layer,
                                                     " are missing, negative or repeated"));
    }
    layers.push_back(b.layer);
  }
  absl::StatusOr<Lease> lease =
      impl_->client->LeaseSequence(sequence_id, layers, absl::ZeroDuration(), call);
  if (!lease.ok()) return lease.status();
  // Ending the lease is best effort on every path: if that call fails, the TTL ends it.
  const LeaseRelease release(impl_->client, lease->lease_id, call);

  absl::StatusOr<OpenPool> pool = impl_->Open(*lease, call);
  if (!pool.ok()) return pool.status();
  const size_t heads = static_cast<size_t>(options.num_kv_heads);
  if (lease->head_dim != options.head_dim || lease->layers.size() != buffers.size() ||
      lease->lanes.size() != buffers.size() * heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("the buffers are for ", options.num_kv_heads, " kv heads x head_dim ",
                     options.head_dim, " but the sequence has ",
                     lease->layers.empty() ? 0 : lease->lanes.size() / lease->layers.size(), " x ",
                     lease->head_dim));
  }
  // Every lane's rows, counted (and checked against the buffers) before anything is written.
  const auto bt = static_cast<size_t>(lease->block_tokens);
  std::vector<int32_t> blocks;
  std::vector<int32_t> slots;
  std::vector<Piece> pieces;
  FetchIntoResult result;
  result.lane_tokens.assign(lease->lanes.size(), 0);
  std::map<StorageFormat, kernels::BlockLayout> layouts;
  for (size_t i = 0; i < lease->lanes.size(); ++i) {
    const LeaseLane& lane = lease->lanes[i];
    const LayerBuffers& buffer = buffers[i / heads];
    if (lane.layer != buffer.layer || static_cast<size_t>(lane.kv_head) != i % heads) {
      return absl::InternalError("the lease's lanes are not in the requested order");
    }
    const auto at = static_cast<size_t>(
        std::find(lease->layers.begin(), lease->layers.end(), lane.layer) - lease->layers.begin());
    const int64_t limit = options.include_unfinished && at < lease->layer_tokens.size()
                              ? lease->layer_tokens[at]
                              : lease->visible_tokens;
    for (const LeaseSegment& seg : lane.segments) {
      if (layouts.count(seg.format) == 0) {
        absl::StatusOr<kernels::BlockLayout> l = CheckedLayout(*lease, seg.format);
        if (!l.ok()) return l.status();
        layouts[seg.format] = *l;
      }
      const auto block_bytes = static_cast<int64_t>(layouts[seg.format].block_bytes);
      Piece piece{i, seg.format, blocks.size(), 0, static_cast<size_t>(result.lane_tokens[i])};
      for (size_t t = 0; t < seg.positions.size(); ++t) {
        if (seg.positions[t] >= limit) continue;
        const int32_t block = t / bt < seg.blocks.size() ? seg.blocks[t / bt] : -1;
        if (block < 0 || (block + 1) * block_bytes > pool->bytes) {
          return absl::InternalError(absl::StrCat("lease block ", block, " is outside pool '",
                                                  lease->pool, "' (", pool->bytes, " bytes)"));
        }
        blocks.push_back(block);
        slots.push_back(static_cast<int32_t>(t % bt));
        if (options.positions) result.positions.push_back(seg.positions[t]);
        ++piece.rows;
      }
      result.lane_tokens[i] += static_cast<int64_t>(piece.rows);
      if (piece.rows > 0) pieces.push_back(piece);
    }
    if (result.lane_tokens[i] > buffer.capacity_tokens) {
      return absl::OutOfRangeError(absl::StrCat(
          "layer ", lane.layer, " kv head ", lane.kv_head, " holds ", result.lane_tokens[i],
          " tokens; its buffers hold ", buffer.capacity_tokens));
    }
  }
  result.visible_tokens = lease->visible_tokens;
  if (blocks.empty()) return result;

  // The (block, slot) arrays go to the device once; then one ReadTokens per piece, all on
  // one stream, and one wait.
  kernels::KernelBackend* backend = pool->backend;
  Scratch rows(backend);  // declared first: freed after the stream's work is waited for
  Stream stream(backend);
  KVC_RETURN_IF_KERNEL_ERROR(stream.Create(), "FetchInto: no CUDA stream");
  const size_t n = blocks.size();
  KVC_RETURN_IF_KERNEL_ERROR(rows.Allocate(2 * n * sizeof(int32_t)),
                             "FetchInto: no device memory for the block tables");
  auto* dev_blocks = static_cast<int32_t*>(rows.get());
  int32_t* dev_slots = dev_blocks + n;
  KVC_RETURN_IF_KERNEL_ERROR(
      backend->CopyToDevice(dev_blocks, blocks.data(), n * sizeof(int32_t), stream.handle()),
      "FetchInto: uploading the block tables");
  KVC_RETURN_IF_KERNEL_ERROR(
      backend->CopyToDevice(dev_slots, slots.data(), n * sizeof(int32_t), stream.handle()),
      "FetchInto: uploading the block tables");
  const size_t row = static_cast<size_t>(options.head_dim) * ElementBytes(options.dtype);
  for (const Piece& p : pieces) {
    const LayerBuffers& buffer = buffers[p.lane / heads];
    const size_t lane_offset = (p.lane % heads) * static_cast<size_t>(buffer.capacity_tokens) * row;
    kernels::ReadTokensArgs a;
    a.arena.base = pool->base;
    a.arena.layout = layouts[p.format];
    a.arena.num_blocks = static_cast<int32_t>(std::min<int64_t>(
        pool->bytes / static_cast<int64_t>(a.arena.layout.block_bytes), INT32_MAX));
    a.num_rows = static_cast<int32_t>(p.rows);
    a.dtype = internal::KernelDType(options.dtype);
    a.keys = static_cast<char*>(buffer.keys) + lane_offset + p.out_row * row;
    a.values = static_cast<char*>(buffer.values) + lane_offset + p.out_row * row;
    a.src_blocks = dev_blocks + p.first;
    a.src_slots = dev_slots + p.first;
    KVC_RETURN_IF_KERNEL_ERROR(backend->ReadTokens(a, stream.handle()),
                               "FetchInto: reading records on the device");
  }
  KVC_RETURN_IF_KERNEL_ERROR(backend->Synchronize(stream.handle()),
                             "FetchInto: reading records on the device");
  // A block of an expired lease may have been reused meanwhile: then nothing read counts.
  if (absl::ToUnixMillis(absl::Now()) >= lease->expires_unix_ms) {
    return absl::AbortedError("the lease expired while it was read; fetch again");
  }
  return result;
}

}  // namespace kvc::client
