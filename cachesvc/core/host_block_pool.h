// HostBlockPool: a BlockPool in host memory. Each storage format gets an arena reserved
// for the whole capacity (MAP_NORESERVE: untouched pages cost nothing), handed out block by
// block; one byte budget across formats caps what is in use. Free blocks of a format are
// reused LIFO (warm memory first); allocate and free are O(1) per block.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/block_pool.h"
#include "cachesvc/core/host_arena.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

class HostBlockPool final : public BlockPool {
 public:
  // Validates options. `backend` must be a host backend (reference or cpu) and outlive the
  // pool.
  static absl::StatusOr<std::unique_ptr<HostBlockPool>> Create(const PoolOptions& options,
                                                               kernels::KernelBackend* backend);

  const PoolOptions& options() const override { return options_; }
  kernels::KernelBackend* backend() const override { return backend_; }
  kernels::KernelBackend* metadata_backend() const override { return backend_; }
  StagingPool* staging() override { return nullptr; }
  kernels::BlockLayout layout(StorageFormat format) const override;
  kernels::PagedArena arena(StorageFormat format) override;
  absl::StatusOr<SharedArena> ShareArena(StorageFormat format) override;
  int64_t capacity_bytes() const override { return options_.capacity_bytes; }
  int64_t used_bytes() const override;
  int64_t used_blocks(StorageFormat format) const override;

  absl::Status Allocate(StorageFormat format, int64_t n, std::vector<BlockId>* out) override;
  void Free(StorageFormat format, absl::Span<const BlockId> blocks) override;

 private:
  struct FormatArena {
    HostArena memory;             // reserved lazily, on the first allocation
    int64_t max_blocks = 0;       // blocks the reservation can hold
    int64_t next_fresh = 0;       // blocks [0, next_fresh) have been handed out before
    std::vector<BlockId> free;    // returned blocks, reused LIFO
    std::vector<bool> allocated;  // double-free guard, grows with next_fresh
  };

  HostBlockPool(const PoolOptions& options, kernels::KernelBackend* backend)
      : options_(options), backend_(backend) {}
  absl::Status ReserveLocked(StorageFormat format) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PoolOptions options_;
  kernels::KernelBackend* const backend_;
  mutable kvc::Mutex mu_;
  std::array<FormatArena, kernels::kNumStorageFormats> arenas_ ABSL_GUARDED_BY(mu_);
  // Written under mu_, read without it (statistics and scrapes take no lock).
  std::atomic<int64_t> used_bytes_{0};
  std::array<std::atomic<int64_t>, kernels::kNumStorageFormats> used_blocks_{};
};

}  // namespace kvc::cachesvc
