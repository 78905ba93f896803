#include "cachesvc/core/host_block_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/pool_options.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

absl::Status FromKernelStatus(const kernels::KernelStatus& status, const char* op) {
  if (status.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(op, ": ", status.detail);
  switch (status.code) {
    case kernels::KernelStatusCode::kInvalidArgument:
      return absl::InvalidArgumentError(message);
    case kernels::KernelStatusCode::kUnsupported:
      return absl::UnimplementedError(message);
    case kernels::KernelStatusCode::kUnavailable:
      return absl::UnavailableError(message);
    case kernels::KernelStatusCode::kOutOfMemory:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<std::unique_ptr<HostBlockPool>> HostBlockPool::Create(
    const PoolOptions& options, kernels::KernelBackend* backend) {
  KVC_RETURN_IF_ERROR(ValidatePoolOptions(options));
  if (options.device != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("pool '", options.name, "': device '",
                                                   options.device,
                                                   "' is not host memory (see DeviceBlockPool)"));
  }
  KVC_CHECK(backend != nullptr && backend->kind() != kernels::BackendKind::kCuda)
      << "a host pool needs a host kernel backend";
  return std::unique_ptr<HostBlockPool>(new HostBlockPool(options, backend));
}

kernels::BlockLayout HostBlockPool::layout(StorageFormat format) const {
  return kernels::MakeBlockLayout(format, options_.geometry.head_dim,
                                  options_.geometry.block_tokens);
}

kernels::PagedArena HostBlockPool::arena(StorageFormat format) {
  kvc::MutexLock lock(&mu_);
  const FormatArena& a = arenas_[static_cast<size_t>(format)];
  kernels::PagedArena view;
  view.base = a.memory.data();
  view.layout = layout(format);
  view.num_blocks = static_cast<int32_t>(a.next_fresh);
  return view;
}

int64_t HostBlockPool::used_bytes() const { return used_bytes_.load(std::memory_order_relaxed); }

int64_t HostBlockPool::used_blocks(StorageFormat format) const {
  return used_blocks_[static_cast<size_t>(format)].load(std::memory_order_relaxed);
}

absl::Status HostBlockPool::ReserveLocked(StorageFormat format) {
  FormatArena& a = arenas_[static_cast<size_t>(format)];
  if (a.memory.data() != nullptr) return absl::OkStatus();
  const int64_t block_bytes = static_cast<int64_t>(layout(format).block_bytes);
  a.max_blocks = std::min<int64_t>(options_.capacity_bytes / block_bytes, INT32_MAX);
  KVC_ASSIGN_OR_RETURN(
      a.memory, HostArena::Create(
                    static_cast<size_t>(a.max_blocks * block_bytes),
                    absl::StrCat("kvc-", options_.name, "-", kernels::StorageFormatName(format))));
  return absl::OkStatus();
}

absl::StatusOr<SharedArena> HostBlockPool::ShareArena(StorageFormat format) {
  KVC_RETURN_IF_ERROR(CheckFormatFits(options_, format));
  kvc::MutexLock lock(&mu_);
  KVC_RETURN_IF_ERROR(ReserveLocked(format));
  const HostArena& memory = arenas_[static_cast<size_t>(format)].memory;
  if (memory.fd() < 0) {
    return absl::FailedPreconditionError(
        "this host has no memfd: the pool's memory cannot be mapped by another process");
  }
  return SharedArena{memory.fd(), static_cast<int64_t>(memory.size())};
}

absl::Status HostBlockPool::Allocate(StorageFormat format, int64_t n, std::vector<BlockId>* out) {
  KVC_CHECK(n >= 0) << n;
  KVC_RETURN_IF_ERROR(CheckFormatFits(options_, format));
  if (n == 0) return absl::OkStatus();
  const int64_t block_bytes = static_cast<int64_t>(layout(format).block_bytes);
  kvc::MutexLock lock(&mu_);
  KVC_RETURN_IF_ERROR(ReserveLocked(format));
  FormatArena& a = arenas_[static_cast<size_t>(format)];
  const int64_t free_bytes = options_.capacity_bytes - used_bytes_.load(std::memory_order_relaxed);
  const int64_t fresh_left = a.max_blocks - a.next_fresh + static_cast<int64_t>(a.free.size());
  if (n * block_bytes > free_bytes || n > fresh_left) {
    return PoolFullError(options_, format, n, block_bytes, free_bytes);
  }
  for (int64_t i = 0; i < n; ++i) {
    BlockId id;
    if (!a.free.empty()) {
      id = a.free.back();
      a.free.pop_back();
    } else {
      id = static_cast<BlockId>(a.next_fresh++);
      a.allocated.push_back(false);
    }
    a.allocated[static_cast<size_t>(id)] = true;
    out->push_back(id);
  }
  used_blocks_[static_cast<size_t>(format)].fetch_add(n, std::memory_order_relaxed);
  used_bytes_.fetch_add(n * block_bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

void HostBlockPool::Free(StorageFormat format, absl::Span<const BlockId> blocks) {
  if (blocks.empty()) return;
  const int64_t block_bytes = static_cast<int64_t>(layout(format).block_bytes);
  kvc::MutexLock lock(&mu_);
  FormatArena& a = arenas_[static_cast<size_t>(format)];
  for (BlockId id : blocks) {
    KVC_CHECK(id >= 0 && id < a.next_fresh)
        << "block " << id << " was never handed out by pool " << options_.name;
    KVC_CHECK(a.allocated[static_cast<size_t>(id)]) << "double free of block " << id;
    a.allocated[static_cast<size_t>(id)] = false;
    a.free.push_back(id);
  }
  const int64_t n = static_cast<int64_t>(blocks.size());
  used_blocks_[static_cast<size_t>(format)].fetch_sub(n, std::memory_order_relaxed);
  used_bytes_.fetch_sub(n * block_bytes, std::memory_order_relaxed);
}

}  // namespace kvc::cachesvc
