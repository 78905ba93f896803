#include "cachesvc/core/host_block_pool.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/pool_options.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

// Blocks the trimmer takes out of the free list at a time: their pages are released in
// ~10 ms here, so an allocation that needs exactly those blocks back waits at most that.
constexpr int64_t kTrimBatchBytes = int64_t{64} << 20;

// Releases the whole pages under each run of consecutive `blocks` (sorted here); returns the
// bytes released, or the first error.
absl::StatusOr<int64_t> ReleaseRuns(HostArena* memory, std::vector<BlockId> blocks,
                                    int64_t block_bytes) {
  std::sort(blocks.begin(), blocks.end());
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  int64_t released = 0;
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i + 1;
    while (j < blocks.size() && blocks[j] == blocks[j - 1] + 1) ++j;
    const int64_t begin = (int64_t{blocks[i]} * block_bytes + page - 1) / page * page;
    const int64_t end = (int64_t{blocks[j - 1]} + 1) * block_bytes / page * page;
    if (end > begin) {
      KVC_RETURN_IF_ERROR(
          memory->ReleasePages(static_cast<size_t>(begin), static_cast<size_t>(end - begin)));
      released += end - begin;
    }
    i = j;
  }
  return released;
}

}  // namespace

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

HostBlockPool::HostBlockPool(const PoolOptions& options, kernels::KernelBackend* backend)
    : options_(options), backend_(backend), keep_free_bytes_(KeepFreeBytes(options)) {
  if (trims()) trimmer_ = std::thread([this] { TrimmerLoop(); });
}

HostBlockPool::~HostBlockPool() {
  if (!trimmer_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(trim_mu_);
    stop_ = true;
  }
  trim_cv_.notify_all();
  trimmer_.join();
}

void HostBlockPool::TrimmerLoop() {
  std::unique_lock<std::mutex> lock(trim_mu_);
  for (;;) {
    trim_cv_.wait(lock, [this] { return trim_wanted_ || stop_; });
    if (stop_) return;
    trim_wanted_ = false;
    lock.unlock();
    TrimFreePages();
    lock.lock();
  }
}

int64_t HostBlockPool::TrimFreePages() {
  // Whoever calls while the trimmer thread is in the middle of a batch waits for it: on
  // return, the pages past the watermark are gone, not merely off the warm list.
  std::lock_guard<std::mutex> one_at_a_time(trim_run_mu_);
  const int64_t keep = keep_free_bytes_ / 2;
  int64_t released = 0;
  for (size_t f = 0; f < static_cast<size_t>(kernels::kNumStorageFormats); ++f) {
    const int64_t block_bytes =
        static_cast<int64_t>(layout(static_cast<StorageFormat>(f)).block_bytes);
    for (;;) {
      std::vector<BlockId> batch;
      HostArena* memory = nullptr;
      {
        kvc::MutexLock lock(&mu_);
        FormatArena& a = arenas_[f];
        if (warm_bytes_ <= keep || a.warm.empty() || !a.memory.releasable()) break;
        const int64_t n = std::min<int64_t>({(warm_bytes_ - keep + block_bytes - 1) / block_bytes,
                                             static_cast<int64_t>(a.warm.size()),
                                             std::max<int64_t>(1, kTrimBatchBytes / block_bytes)});
        // The bottom of the LIFO list: freed longest ago, the least likely to be reused warm.
        batch.assign(a.warm.begin(), a.warm.begin() + n);
        a.warm.erase(a.warm.begin(), a.warm.begin() + n);
        a.trimming += n;
        warm_bytes_ -= n * block_bytes;
        free_resident_bytes_.store(warm_bytes_, std::memory_order_relaxed);
        memory = &a.memory;  // created once, before any block of it was free
      }
      const absl::StatusOr<int64_t> done = ReleaseRuns(memory, batch, block_bytes);
      kvc::MutexLock lock(&mu_);
      FormatArena& a = arenas_[f];
      a.trimming -= static_cast<int64_t>(batch.size());
      if (!done.ok()) {
        // Not released after all (the OS refused): the blocks are still warm, and trying
        // again now would fail the same way.
        a.warm.insert(a.warm.begin(), batch.begin(), batch.end());
        warm_bytes_ += static_cast<int64_t>(batch.size()) * block_bytes;
        free_resident_bytes_.store(warm_bytes_, std::memory_order_relaxed);
        break;
      }
      a.cold.insert(a.cold.end(), batch.begin(), batch.end());
      released += *done;
      released_bytes_.fetch_add(*done, std::memory_order_relaxed);
    }
  }
  return released;
}

int64_t HostBlockPool::ResidentBytes() const {
  kvc::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const FormatArena& a : arenas_) {
    const int64_t bytes = a.memory.ResidentBytes();
    if (bytes < 0) return -1;
    total += bytes;
  }
  return total;
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

int64_t HostBlockPool::free_resident_bytes() const {
  return free_resident_bytes_.load(std::memory_order_relaxed);
}

int64_t HostBlockPool::released_bytes_total() const {
  return released_bytes_.load(std::memory_order_relaxed);
}

absl::Status HostBlockPool::ReserveLocked(StorageFormat format) {
  FormatArena& a = arenas_[static_cast<size_t>(format)];
  if (a.memory.data() != nullptr) return absl::OkStatus();
  const int64_t block_bytes = static_cast<int64_t>(layout(format).block_bytes);
  a.max_blocks = std::min<int64_t>(options_.capacity_bytes / block_bytes, INT32_MAX);
  KVC_ASSIGN_OR_RETURN(a.memory, HostArena::Create(static_cast<size_t>(a.max_blocks * block_bytes),
                                                   absl::StrCat("kvc-", options_.name, "-",
                                                                kernels::StorageFormatName(format)),
                                                   /*releasable=*/trims()));
  return absl::OkStatus();
}

absl::StatusOr<SharedArena> HostBlockPool::ShareArena(StorageFormat format) {
  KVC_RETURN_IF_ERROR(CheckFormatFits(options_, format));
  kvc::MutexLock lock(&mu_);
  KVC_RETURN_IF_ERROR(ReserveLocked(format));
  const HostArena& memory = arenas_[static_cast<size_t>(format)].memory;
  if (memory.shared_fd() < 0) {
    return absl::FailedPreconditionError(
        "this host has no memfd: the pool's memory cannot be mapped by another process");
  }
  SharedArena shared;
  shared.fd = memory.shared_fd();
  shared.bytes = static_cast<int64_t>(memory.size());
  return shared;
}

absl::Status HostBlockPool::Allocate(StorageFormat format, int64_t n, std::vector<BlockId>* out) {
  KVC_CHECK(n >= 0) << n;
  KVC_RETURN_IF_ERROR(CheckFormatFits(options_, format));
  if (n == 0) return absl::OkStatus();
  const int64_t block_bytes = static_cast<int64_t>(layout(format).block_bytes);
  for (;;) {
    {
      kvc::MutexLock lock(&mu_);
      KVC_RETURN_IF_ERROR(ReserveLocked(format));
      FormatArena& a = arenas_[static_cast<size_t>(format)];
      const int64_t free_bytes =
          options_.capacity_bytes - used_bytes_.load(std::memory_order_relaxed);
      const int64_t listed = static_cast<int64_t>(a.warm.size() + a.cold.size());
      const int64_t at_hand = a.max_blocks - a.next_fresh + listed;
      if (n * block_bytes > free_bytes || n > at_hand + a.trimming) {
        return PoolFullError(options_, format, n, block_bytes, free_bytes);
      }
      if (n <= at_hand) {
        int64_t warm_taken = 0;
        for (int64_t i = 0; i < n; ++i) {
          BlockId id;
          if (!a.warm.empty()) {
            id = a.warm.back();
            a.warm.pop_back();
            ++warm_taken;
          } else if (!a.cold.empty()) {
            id = a.cold.back();
            a.cold.pop_back();
          } else {
            id = static_cast<BlockId>(a.next_fresh++);
            a.allocated.push_back(false);
          }
          a.allocated[static_cast<size_t>(id)] = true;
          out->push_back(id);
        }
        warm_bytes_ -= warm_taken * block_bytes;
        free_resident_bytes_.store(warm_bytes_, std::memory_order_relaxed);
        used_blocks_[static_cast<size_t>(format)].fetch_add(n, std::memory_order_relaxed);
        used_bytes_.fetch_add(n * block_bytes, std::memory_order_relaxed);
        return absl::OkStatus();
      }
    }
    // Only blocks the trimmer holds would do: they are back within one batch's release.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void HostBlockPool::Free(StorageFormat format, absl::Span<const BlockId> blocks) {
  if (blocks.empty()) return;
  const int64_t block_bytes = static_cast<int64_t>(layout(format).block_bytes);
  bool trim = false;
  {
    kvc::MutexLock lock(&mu_);
    FormatArena& a = arenas_[static_cast<size_t>(format)];
    for (BlockId id : blocks) {
      KVC_CHECK(id >= 0 && id < a.next_fresh)
          << "block " << id << " was never handed out by pool " << options_.name;
      KVC_CHECK(a.allocated[static_cast<size_t>(id)]) << "double free of block " << id;
      a.allocated[static_cast<size_t>(id)] = false;
      a.warm.push_back(id);
    }
    const int64_t n = static_cast<int64_t>(blocks.size());
    used_blocks_[static_cast<size_t>(format)].fetch_sub(n, std::memory_order_relaxed);
    used_bytes_.fetch_sub(n * block_bytes, std::memory_order_relaxed);
    warm_bytes_ += n * block_bytes;
    free_resident_bytes_.store(warm_bytes_, std::memory_order_relaxed);
    trim = trims() && warm_bytes_ > keep_free_bytes_;
  }
  if (trim) {
    {
      std::lock_guard<std::mutex> lock(trim_mu_);
      trim_wanted_ = true;
    }
    trim_cv_.notify_one();
  }
}

}  // namespace kvc::cachesvc
