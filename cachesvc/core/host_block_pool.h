// HostBlockPool: a BlockPool in host memory. Each storage format gets an arena reserved
// for the whole capacity (MAP_NORESERVE: untouched pages cost nothing), handed out block by
// block; one byte budget across formats caps what is in use. Free blocks of a format are
// reused LIFO (warm memory first); allocate and free are O(1) per block.
//
// Freed blocks keep their pages for reuse up to keep_free_bytes across the pool's formats.
// Past it, a background thread (the trimmer) takes the oldest free blocks out of the free
// list in small batches, returns the whole pages under runs of them to the OS (outside the
// pool's lock: punching 512 MiB takes ~100 ms here) and puts them on a cold list, used after
// the warm one. A page shared with a block still in use or kept warm stays.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
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
  ~HostBlockPool() override;
  // The trimmer thread holds `this`.
  HostBlockPool(const HostBlockPool&) = delete;
  HostBlockPool& operator=(const HostBlockPool&) = delete;
  HostBlockPool(HostBlockPool&&) = delete;
  HostBlockPool& operator=(HostBlockPool&&) = delete;

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
  int64_t free_resident_bytes() const override;
  int64_t released_bytes_total() const override;

  absl::Status Allocate(StorageFormat format, int64_t n, std::vector<BlockId>* out) override;
  void Free(StorageFormat format, absl::Span<const BlockId> blocks) override;

  // The trimmer's work, done now on this thread (after any trim in flight has finished):
  // while more than keep_free_bytes / 2 of free blocks are warm, returns the oldest ones'
  // pages to the OS. Returns the bytes of pages this call released.
  int64_t TrimFreePages();
  // Bytes of the pool's arenas that hold pages now (HostArena::ResidentBytes summed), -1
  // where an arena is anonymous memory.
  int64_t ResidentBytes() const;

 private:
  struct FormatArena {
    HostArena memory;             // reserved lazily, on the first allocation
    int64_t max_blocks = 0;       // blocks the reservation can hold
    int64_t next_fresh = 0;       // blocks [0, next_fresh) have been handed out before
    std::vector<BlockId> warm;    // freed, pages resident; reused LIFO
    std::vector<BlockId> cold;    // freed, pages returned to the OS; used after `warm`
    int64_t trimming = 0;         // freed blocks out of both lists while the trimmer works
    std::vector<bool> allocated;  // double-free guard, grows with next_fresh
  };

  HostBlockPool(const PoolOptions& options, kernels::KernelBackend* backend);
  absl::Status ReserveLocked(StorageFormat format) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when the arenas may give pages back at all.
  bool trims() const { return keep_free_bytes_ < options_.capacity_bytes; }
  void TrimmerLoop();

  const PoolOptions options_;
  kernels::KernelBackend* const backend_;
  const int64_t keep_free_bytes_;  // KeepFreeBytes(options_)
  mutable kvc::Mutex mu_;
  std::array<FormatArena, kernels::kNumStorageFormats> arenas_ ABSL_GUARDED_BY(mu_);
  int64_t warm_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Written under mu_, read without it (statistics and scrapes take no lock).
  std::atomic<int64_t> used_bytes_{0};
  std::array<std::atomic<int64_t>, kernels::kNumStorageFormats> used_blocks_{};
  std::atomic<int64_t> free_resident_bytes_{0};
  std::atomic<int64_t> released_bytes_{0};

  // The trimmer wakes when Free leaves more than keep_free_bytes warm.
  std::mutex trim_run_mu_;  // held through TrimFreePages; taken before mu_, never after
  std::mutex trim_mu_;
  std::condition_variable trim_cv_;
  bool trim_wanted_ = false;  // guarded by trim_mu_
  bool stop_ = false;         // guarded by trim_mu_
  std::thread trimmer_;       // last: started once everything above exists
};

}  // namespace kvc::cachesvc
