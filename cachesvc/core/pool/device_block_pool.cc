#include "cachesvc/core/pool/device_block_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/pool/pool_options.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

constexpr int64_t kDeviceAlign = 256;
constexpr int64_t kMaxSlabBytes = int64_t{4} << 20;

int64_t AlignDevice(int64_t n) { return (n + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign; }

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBlockPool>> DeviceBlockPool::Create(
    const PoolOptions& options, kernels::KernelBackend* backend, kernels::KernelBackend* metadata) {
  KVC_RETURN_IF_ERROR(ValidatePoolOptions(options));
  KVC_CHECK(backend != nullptr && metadata != nullptr &&
            metadata->kind() != kernels::BackendKind::kCuda);
  const PoolGeometry& g = options.geometry;
  int64_t largest = 0;
  for (int f = 0; f < kernels::kNumStorageFormats; ++f) {
    const auto format = static_cast<StorageFormat>(f);
    if (!kernels::FormatSupportsHeadDim(format, g.head_dim)) continue;
    largest = std::max(
        largest, static_cast<int64_t>(
                     kernels::MakeBlockLayout(format, g.head_dim, g.block_tokens).block_bytes));
  }
  // Eight of the largest blocks per slab bound the alignment waste at the slab's edges to an
  // eighth; small pools get smaller slabs so that several formats fit at once.
  const int64_t slab =
      AlignDevice(std::max(8 * largest, std::min(kMaxSlabBytes, options.capacity_bytes / 32)));
  void* p = nullptr;
  const kernels::KernelStatus ks =
      backend->Allocate(static_cast<size_t>(AlignDevice(options.capacity_bytes)), &p);
  if (!ks.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pool '", options.name, "': cannot allocate capacity_bytes ",
                     options.capacity_bytes, " on ", options.device, ": ", ks.detail));
  }
  BackendBuffer memory = BackendBuffer::Adopt(backend, p);
  return std::unique_ptr<DeviceBlockPool>(
      new DeviceBlockPool(options, backend, metadata, std::move(memory), slab));
}

DeviceBlockPool::DeviceBlockPool(const PoolOptions& options, kernels::KernelBackend* backend,
                                 kernels::KernelBackend* metadata, BackendBuffer memory,
                                 int64_t slab_bytes)
    : options_(options),
      backend_(backend),
      metadata_(metadata),
      staging_(backend),
      memory_(std::move(memory)),
      slab_bytes_(slab_bytes) {
  const int64_t n = (options_.capacity_bytes + slab_bytes_ - 1) / slab_bytes_;
  kvc::MutexLock lock(&mu_);
  slabs_.resize(static_cast<size_t>(n));
  for (int64_t s = n - 1; s >= 0; --s) free_slabs_.push_back(static_cast<int32_t>(s));
}

absl::StatusOr<SharedArena> DeviceBlockPool::ShareArena(StorageFormat format,
                                                        const std::string& owner) {
  KVC_RETURN_IF_ERROR(CheckFormatFits(options_, format));
  // CUDA IPC opens the whole allocation, every sequence's KV in it: only the one scope the
  // pool holds sequences of may have it.
  if (owner != options_.tenant) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool '", options_.name, "' on ", options_.device,
        options_.tenant.empty()
            ? " holds every tenant's KV in one allocation: CUDA IPC would expose all of it (a "
              "device pool is shared over CUDA IPC only when its config names one tenant)"
            : " is dedicated to another tenant"));
  }
  KVC_ASSIGN_OR_RETURN(const int device, ParsePoolDevice(options_.device));
  kvc::MutexLock lock(&mu_);
  if (!ipc_.has_value()) {
    kernels::IpcMemHandle handle;
    const kernels::KernelStatus ks = backend_->ExportIpcHandle(memory_.data(), &handle);
    if (!ks.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool '", options_.name, "' on ", options_.device,
                       " cannot be shared with another process (CUDA IPC): ", ks.detail));
    }
    ipc_ = handle;
  }
  SharedArena shared;
  shared.bytes = AlignDevice(options_.capacity_bytes);
  shared.device = device;
  shared.cuda_ipc = *ipc_;
  return shared;
}

kernels::BlockLayout DeviceBlockPool::layout(StorageFormat format) const {
  return kernels::MakeBlockLayout(format, options_.geometry.head_dim,
                                  options_.geometry.block_tokens);
}

kernels::PagedArena DeviceBlockPool::arena(StorageFormat format) {
  kernels::PagedArena view;
  view.base = memory_.data();
  view.layout = layout(format);
  view.num_blocks = static_cast<int32_t>(std::min<int64_t>(
      options_.capacity_bytes / static_cast<int64_t>(view.layout.block_bytes), INT32_MAX));
  return view;
}

int64_t DeviceBlockPool::used_bytes() const { return used_bytes_.load(std::memory_order_relaxed); }

int64_t DeviceBlockPool::used_blocks(StorageFormat format) const {
  return used_blocks_[static_cast<size_t>(format)].load(std::memory_order_relaxed);
}

void DeviceBlockPool::SlabBlocks(int format, int32_t s, std::vector<BlockId>* out) const {
  const int64_t bb = static_cast<int64_t>(layout(static_cast<StorageFormat>(format)).block_bytes);
  const int64_t begin = int64_t{s} * slab_bytes_;
  const int64_t end = std::min(begin + slab_bytes_, options_.capacity_bytes);
  // Highest id first: the free list is a stack, so blocks go out in address order.
  for (int64_t k = end / bb - 1; k >= (begin + bb - 1) / bb; --k) {
    if (k < INT32_MAX) out->push_back(static_cast<BlockId>(k));
  }
}

void DeviceBlockPool::ReleaseSlabLocked(int32_t s) {
  Slab& slab = slabs_[static_cast<size_t>(s)];
  if (slab.in_partial) {
    std::vector<int32_t>& list = partial_[static_cast<size_t>(slab.format)];
    list.erase(std::find(list.begin(), list.end(), s));
  }
  slab = Slab{};
  free_slabs_.push_back(s);
}

absl::Status DeviceBlockPool::AllocateFor(StorageFormat format, int64_t n,
                                          const std::string& /*owner*/, std::vector<BlockId>* out) {
  KVC_CHECK(n >= 0) << n;
  KVC_RETURN_IF_ERROR(CheckFormatFits(options_, format));
  if (n == 0) return absl::OkStatus();
  const int f = static_cast<int>(format);
  const int64_t block_bytes = static_cast<int64_t>(layout(format).block_bytes);
  kvc::MutexLock lock(&mu_);
  const int64_t free_bytes = options_.capacity_bytes - used_bytes_.load(std::memory_order_relaxed);
  if (n * block_bytes > free_bytes) {
    return PoolFullError(options_, format, n, block_bytes, free_bytes);
  }
  // Free blocks of this format's slabs first, then fresh slabs; all or none.
  std::vector<BlockId> taken;
  std::vector<int32_t> claimed;
  std::vector<int32_t>& partial = partial_[static_cast<size_t>(f)];
  size_t next_partial = partial.size();
  while (static_cast<int64_t>(taken.size()) < n) {
    int32_t s = -1;
    if (next_partial > 0) {
      s = partial[--next_partial];
    } else if (!free_slabs_.empty()) {
      s = free_slabs_.back();
      free_slabs_.pop_back();
      claimed.push_back(s);
      Slab& slab = slabs_[static_cast<size_t>(s)];
      slab.format = f;
      SlabBlocks(f, s, &slab.free);
    } else {
      break;
    }
    Slab& slab = slabs_[static_cast<size_t>(s)];
    while (!slab.free.empty() && static_cast<int64_t>(taken.size()) < n) {
      taken.push_back(slab.free.back());
      slab.free.pop_back();
      ++slab.used;
    }
  }
  const int64_t block_slot = slab_bytes_ / block_bytes;
  if (static_cast<int64_t>(taken.size()) < n) {
    // Undo: every block back to its slab, claimed slabs back to the free list.
    for (auto it = taken.rbegin(); it != taken.rend(); ++it) {
      Slab& slab = slabs_[static_cast<size_t>(int64_t{*it} * block_bytes / slab_bytes_)];
      slab.free.push_back(*it);
      --slab.used;
    }
    for (auto it = claimed.rbegin(); it != claimed.rend(); ++it) {
      slabs_[static_cast<size_t>(*it)] = Slab{};
      free_slabs_.push_back(*it);
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool '", options_.name, "' has no room for ", n, " ", kernels::StorageFormatName(format),
        " blocks: ", free_bytes, " bytes are free but they lie in slabs (", slab_bytes_,
        " bytes, ~", block_slot,
        " such blocks each) that hold other formats' blocks; release or "
        "compress sequences, or give the pool more capacity_bytes"));
  }
  // Slabs emptied by this request leave the partial list; fresh ones with blocks left join it.
  size_t keep = next_partial;
  for (size_t i = next_partial; i < partial.size(); ++i) {
    Slab& slab = slabs_[static_cast<size_t>(partial[i])];
    if (slab.free.empty()) {
      slab.in_partial = false;
    } else {
      partial[keep++] = partial[i];
    }
  }
  partial.resize(keep);
  for (int32_t s : claimed) {
    Slab& slab = slabs_[static_cast<size_t>(s)];
    if (!slab.free.empty()) {
      slab.in_partial = true;
      partial.push_back(s);
    }
  }
  out->insert(out->end(), taken.begin(), taken.end());
  used_blocks_[static_cast<size_t>(f)].fetch_add(n, std::memory_order_relaxed);
  used_bytes_.fetch_add(n * block_bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

void DeviceBlockPool::Free(StorageFormat format, absl::Span<const BlockId> blocks) {
  if (blocks.empty()) return;
  const int f = static_cast<int>(format);
  const int64_t block_bytes = static_cast<int64_t>(layout(format).block_bytes);
  kvc::MutexLock lock(&mu_);
  for (BlockId id : blocks) {
    const int64_t s = int64_t{id} * block_bytes / slab_bytes_;
    KVC_CHECK(id >= 0 && s < static_cast<int64_t>(slabs_.size()))
        << "block " << id << " was never handed out by pool " << options_.name;
    Slab& slab = slabs_[static_cast<size_t>(s)];
    KVC_CHECK(slab.format == f && slab.used > 0)
        << "free of block " << id << " that pool " << options_.name << " did not hand out";
    slab.free.push_back(id);
    --slab.used;
    if (slab.used == 0) {
      ReleaseSlabLocked(static_cast<int32_t>(s));
    } else if (!slab.in_partial) {
      slab.in_partial = true;
      partial_[static_cast<size_t>(f)].push_back(static_cast<int32_t>(s));
    }
  }
  const int64_t n = static_cast<int64_t>(blocks.size());
  used_blocks_[static_cast<size_t>(f)].fetch_sub(n, std::memory_order_relaxed);
  used_bytes_.fetch_sub(n * block_bytes, std::memory_order_relaxed);
}

}  // namespace kvc::cachesvc
