// DeviceBlockPool: a BlockPool in the memory of one CUDA device.
//
// A host pool reserves address space for its whole capacity once per storage format and lets
// the OS commit pages as blocks are written; device memory has no such overcommit through the
// runtime API, so a device pool takes its capacity in ONE device allocation at creation (a
// device too small fails at startup, not at the first append) and carves it per format in
// slabs: a slab belongs to one format while any of its blocks is in use and returns to the
// shared list when its last block is freed. Every format's arena view starts at the base of
// the allocation, so a block id is its byte offset / the format's block size; a slab holds the
// blocks of its format that lie wholly inside it. The byte budget across formats is the same
// as a host pool's; a request can also fail when every slab is held by other formats' partly
// used slabs (the error says so). Staging contexts for the ops' arguments live here too.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/base/backend_buffer.h"
#include "cachesvc/core/pool/block_pool.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

class DeviceBlockPool final : public BlockPool {
 public:
  // Validates options and allocates capacity_bytes on `backend` (a CUDA backend);
  // RESOURCE_EXHAUSTED naming the pool when the device cannot hold it. `metadata` is a host
  // backend for metadata-only ops. Both must outlive the pool.
  static absl::StatusOr<std::unique_ptr<DeviceBlockPool>> Create(const PoolOptions& options,
                                                                 kernels::KernelBackend* backend,
                                                                 kernels::KernelBackend* metadata);

  const PoolOptions& options() const override { return options_; }
  kernels::KernelBackend* backend() const override { return backend_; }
  kernels::KernelBackend* metadata_backend() const override { return metadata_; }
  StagingPool* staging() override { return &staging_; }
  kernels::BlockLayout layout(StorageFormat format) const override;
  kernels::PagedArena arena(StorageFormat format) override;
  int64_t capacity_bytes() const override { return options_.capacity_bytes; }
  int64_t used_bytes() const override;
  int64_t used_blocks(StorageFormat format) const override;

  // Owners are not kept apart in device memory (one allocation, shared over CUDA IPC only
  // with the pool's one tenant: ShareArena).
  absl::Status AllocateFor(StorageFormat format, int64_t n, const std::string& owner,
                           std::vector<BlockId>* out) override;
  void Free(StorageFormat format, absl::Span<const BlockId> blocks) override;

  // The CUDA IPC handle of the pool's allocation (every format's arena starts at it),
  // exported on first use, for `owner` only when it is the pool's tenant
  // (PoolOptions::tenant). FAILED_PRECONDITION otherwise or when the device cannot export it.
  absl::StatusOr<SharedArena> ShareArena(StorageFormat format, const std::string& owner) override;

  int64_t slab_bytes() const { return slab_bytes_; }

 private:
  struct Slab {
    int format = -1;            // owner, -1 when free
    int32_t used = 0;           // blocks handed out
    std::vector<BlockId> free;  // the owner's free blocks in this slab
    bool in_partial = false;    // listed in its owner's partial_
  };

  DeviceBlockPool(const PoolOptions& options, kernels::KernelBackend* backend,
                  kernels::KernelBackend* metadata, BackendBuffer memory, int64_t slab_bytes);
  // Block ids of `format` that lie wholly inside slab `s`.
  void SlabBlocks(int format, int32_t s, std::vector<BlockId>* out) const;
  void ReleaseSlabLocked(int32_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PoolOptions options_;
  kernels::KernelBackend* const backend_;
  kernels::KernelBackend* const metadata_;
  StagingPool staging_;
  const BackendBuffer memory_;
  const int64_t slab_bytes_;
  mutable kvc::Mutex mu_;
  std::vector<Slab> slabs_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> free_slabs_ ABSL_GUARDED_BY(mu_);  // LIFO
  // Per format: its slabs that have free blocks.
  std::array<std::vector<int32_t>, kernels::kNumStorageFormats> partial_ ABSL_GUARDED_BY(mu_);
  // The exported handle, once ShareArena made it (one per allocation: it never changes).
  std::optional<kernels::IpcMemHandle> ipc_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> used_bytes_{0};
  std::array<std::atomic<int64_t>, kernels::kNumStorageFormats> used_blocks_{};
};

}  // namespace kvc::cachesvc
