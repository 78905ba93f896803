// BlockPool: fixed-size blocks carved from one byte capacity, one arena per storage format
// (a format's blocks all have that format's size). HostBlockPool implements it with reserved
// host memory, DeviceBlockPool with device memory. The bytes are reached only through kernels
// (PagedArena views + a KernelBackend, with OpStage moving the ops' host arguments), so the
// service logic is the same for both.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cachesvc/core/base/types.h"
#include "cachesvc/core/base/unique_fd.h"
#include "cachesvc/core/pool/block_shares.h"
#include "cachesvc/core/pool/staging.h"
#include "kvc/kernels/backend.h"
#include "kvc/kernels/paged_view.h"

namespace kvc::cachesvc {

// What a same-node reader is told of a format's arena (cachesvc/transport/local_socket.h).
// Host pools: the arena's reserved `bytes` and its `segment_bytes`: segment i (its own memfd,
// handed out by ShareSegment to readers of its owner only) maps at byte i * segment_bytes,
// so block b of the format lies at b * block_bytes as kvcached sees it. Device pools:
// segment_bytes 0, and the CUDA IPC handle of the pool's one allocation, which every format's
// arena starts at, on device ordinal `device`; `bytes` is the allocation's.
struct SharedArena {
  int64_t bytes = 0;
  int64_t segment_bytes = 0;
  int device = -1;
  kernels::IpcMemHandle cuda_ipc;
};

class BlockPool {
 public:
  virtual ~BlockPool() = default;

  virtual const PoolOptions& options() const = 0;
  // The backend whose memory the arenas live in; every kernel op on them runs there.
  virtual kernels::KernelBackend* backend() const = 0;
  // A host backend for the ops that touch no KV memory (Select, AccumulateScores): their
  // inputs are the per-token metadata, which lives in host memory for every pool.
  virtual kernels::KernelBackend* metadata_backend() const = 0;
  // Staging contexts for ops on device memory (see OpStage); null for a host pool.
  virtual StagingPool* staging() = 0;
  // Layout of `format` for this pool's head_dim and block_tokens.
  virtual kernels::BlockLayout layout(StorageFormat format) const = 0;
  // The arena of `format` for kernel ops. Blocks handed out by Allocate(format) index it.
  virtual kernels::PagedArena arena(StorageFormat format) = 0;

  // Same-node readers (cachesvc/transport/local_socket.h). Every block belongs to the owner it was
  // allocated for (AllocateFor: the sequence's scope, i.e. its tenant), and a reader acting
  // for `owner` is given only memory that holds that owner's blocks or zeros.
  //
  // The shape of `format`'s arena as a reader maps it, reserved now if it was not yet.
  // FAILED_PRECONDITION where the memory cannot be shared (a host without memfd, a device
  // without CUDA IPC, a device pool that is not dedicated to `owner`).
  virtual absl::StatusOr<SharedArena> ShareArena(StorageFormat /*format*/,
                                                 const std::string& /*owner*/) {
    return absl::FailedPreconditionError(
        "this pool's memory cannot be mapped by another process (device memory)");
  }
  // A read-only descriptor of host segment `index` of `format`'s arena, owned by the caller:
  // only while the segment is claimed by `owner` with memfd `epoch`; otherwise
  // FAILED_PRECONDITION (another owner's segment reads as one that holds nothing).
  virtual absl::StatusOr<UniqueFd> ShareSegment(StorageFormat /*format*/,
                                                const std::string& /*owner*/, int64_t /*index*/,
                                                uint64_t /*epoch*/) {
    return absl::FailedPreconditionError("this pool has no host segments");
  }
  // The segments `blocks` of `format` lie in, each once, with their current epochs: what a
  // lease of those blocks tells a reader to map. Empty for device pools.
  virtual std::vector<SegmentRef> SegmentsOf(StorageFormat /*format*/,
                                             absl::Span<const BlockId> /*blocks*/) const {
    return {};
  }

  // Copies whole blocks of `format` to `dst` (block i at i * block_bytes), keeping only the
  // first slots[i] token records of block i and zeroing the rest: a leased block's later
  // slots may be written meanwhile (an append filling a partly filled block) or hold an
  // earlier owner's data. For blocks a lease pins (SendLease). `dst` is host memory
  // (kHost), or memory of this pool's backend (kPoolMemory: device memory of a device pool,
  // for a sender that sends from the device). Returns once the copy finished. INTERNAL for
  // a block outside the arena. Through the backend's copy ops (block_copy_out.cc), so the
  // same for host and device pools.
  enum class CopyTo { kHost, kPoolMemory };
  absl::Status CopyBlocksOut(StorageFormat format, absl::Span<const BlockId> blocks,
                             absl::Span<const int32_t> slots, char* dst, CopyTo to);

  virtual int64_t capacity_bytes() const = 0;
  // Thread-safe momentary values.
  virtual int64_t used_bytes() const = 0;
  virtual int64_t used_blocks(StorageFormat format) const = 0;
  // Host pools (PoolOptions::keep_free_bytes): bytes of free blocks whose pages are resident,
  // and bytes of pages returned to the OS since start. 0 where memory is never returned.
  virtual int64_t free_resident_bytes() const { return 0; }
  virtual int64_t released_bytes_total() const { return 0; }

  // Takes `n` blocks of `format` for `owner` (a scope: blocks of different owners never share
  // host memory a reader can map), all or none. RESOURCE_EXHAUSTED (naming the pool, the
  // need and what is free) when the byte capacity cannot hold them; INVALID_ARGUMENT when
  // the format cannot store this pool's head_dim. Thread-safe.
  virtual absl::Status AllocateFor(StorageFormat format, int64_t n, const std::string& owner,
                                   std::vector<BlockId>* out) = 0;
  // For owner "" (the scope of an unauthenticated deployment; tests).
  absl::Status Allocate(StorageFormat format, int64_t n, std::vector<BlockId>* out) {
    return AllocateFor(format, n, "", out);
  }
  // Returns blocks to their format's free list and their bytes to the capacity at once.
  // Only for blocks nothing else holds (fresh, never published); published metadata lets go
  // of its blocks through Drop.
  virtual void Free(StorageFormat format, absl::Span<const BlockId> blocks) = 0;

  // Which blocks are shared (prefix cache, attached prefixes) and by how many holders.
  BlockShares& shares() { return shares_; }
  const BlockShares& shares() const { return shares_; }
  // One holder of kind `holder` of each block lets go; blocks nobody holds any more return to
  // the pool (how many: the result). Blocks only leases hold now are charged to their lessee
  // (BlockShares).
  int64_t Drop(StorageFormat format, absl::Span<const BlockId> blocks, Holder holder);
  // A lease lets go of the blocks it pinned with `charge` (BlockShares::Unpin); blocks nobody
  // holds any more return to the pool (how many: the result).
  int64_t Unpin(StorageFormat format, absl::Span<const BlockId> blocks, const LeaseCharge& charge);

  // Allocate, but when the pool is full, first asks the reclaimer (the prefix cache) to give
  // back cached blocks nobody uses, then tries once more.
  absl::Status AllocateOrReclaim(StorageFormat format, int64_t n, const std::string& owner,
                                 std::vector<BlockId>* out);
  // Set once, before the pool is used: frees at least `bytes` of unused cached blocks if it
  // can and returns the bytes it freed.
  void set_reclaimer(std::function<int64_t(int64_t bytes)> reclaimer) {
    reclaimer_ = std::move(reclaimer);
  }

 private:
  BlockShares shares_;
  std::function<int64_t(int64_t)> reclaimer_;
};

// absl::Status for a failed kernel op (one mapping for the whole service).
absl::Status FromKernelStatus(const kernels::KernelStatus& status, const char* op);

}  // namespace kvc::cachesvc
