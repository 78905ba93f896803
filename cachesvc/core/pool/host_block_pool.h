// HostBlockPool: a BlockPool in host memory. Each storage format gets an arena (host_arena.h):
// address space for twice the capacity, carved into segments that are backed by memory only
// while claimed. One byte budget across formats caps the blocks in use.
//
// Owners. Every segment belongs to one owner at a time (the scope that allocated its blocks:
// the tenant), and AllocateFor hands an owner only blocks of its own segments, claiming a
// fresh one (new, zeroed memory) when those are full. So a same-node reader of one tenant,
// given only that tenant's segments (ShareSegment), maps no byte another tenant wrote: the
// isolation is the layout's, not a check on each read. A segment whose blocks are all free
// stays with its owner, warm, until the trimmer returns it or another owner needs a segment
// and none is unclaimed; then it goes back (its pages returned first) and is claimed anew.
// Address space is reserved for twice the capacity (plus slack), so owners' partly used
// segments cannot run the pool out of segments while bytes are free, short of extreme
// fragmentation (RESOURCE_EXHAUSTED then, as for a full pool).
//
// Within a segment, free blocks are reused LIFO (warm memory first). Freed blocks keep their
// pages up to keep_free_bytes across the pool's formats. Past it, a background thread (the
// trimmer) returns whole free segments first, then the whole pages under runs of free blocks
// (outside the pool's lock: punching 512 MiB takes ~100 ms here), which move to a cold list
// used after the warm one. A page shared with a block still in use or kept warm stays.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/pool/block_pool.h"
#include "cachesvc/core/pool/host_arena.h"
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
  absl::StatusOr<SharedArena> ShareArena(StorageFormat format, const std::string& owner) override;
  absl::StatusOr<UniqueFd> ShareSegment(StorageFormat format, const std::string& owner,
                                        int64_t index, uint64_t epoch) override;
  std::vector<SegmentRef> SegmentsOf(StorageFormat format,
                                     absl::Span<const BlockId> blocks) const override;
  int64_t capacity_bytes() const override { return options_.capacity_bytes; }
  int64_t used_bytes() const override;
  int64_t used_blocks(StorageFormat format) const override;
  int64_t free_resident_bytes() const override;
  int64_t released_bytes_total() const override;

  absl::Status AllocateFor(StorageFormat format, int64_t n, const std::string& owner,
                           std::vector<BlockId>* out) override;
  void Free(StorageFormat format, absl::Span<const BlockId> blocks) override;

  // The trimmer's work, done now on this thread (after any trim in flight has finished):
  // while more than keep_free_bytes / 2 of free blocks are warm, returns free segments, then
  // the oldest free blocks' pages, to the OS. Returns the bytes of pages this call released.
  int64_t TrimFreePages();
  // Bytes of the pool's arenas that hold pages now (HostArena::ResidentBytes summed), -1
  // where an arena is anonymous memory.
  int64_t ResidentBytes() const;
  // Segment bytes of `format`'s arena (a multiple of its block bytes and of the page size).
  int64_t segment_bytes(StorageFormat format) const;
  // Segments claimed now, all formats (for tests and statistics).
  int64_t claimed_segments() const;

 private:
  static constexpr int32_t kUnclaimed = -1;
  static constexpr int32_t kReleasing = -2;  // the trimmer is returning it

  struct Segment {
    int32_t owner = kUnclaimed;   // index into owner_ids_, or kUnclaimed / kReleasing
    uint64_t epoch = 0;           // of its current memfd (BlockPool::SegmentRef)
    int32_t used = 0;             // blocks handed out
    int32_t trimming = 0;         // free blocks out of both lists while the trimmer works
    std::vector<BlockId> warm;    // freed, pages resident; reused LIFO
    std::vector<BlockId> cold;    // never used, or pages returned; used after `warm`
    std::vector<bool> allocated;  // per block of the segment: double-free guard
  };
  // An owner's segments of one format that have free blocks.
  struct Owned {
    std::set<int64_t> warm;  // ... warm ones among them
    std::set<int64_t> any;
    int64_t free = 0;      // free blocks in them (not counting those being trimmed)
    int64_t trimming = 0;  // its free blocks the trimmer holds
    int64_t empty = 0;     // its segments in FormatArena::empty
  };
  struct FormatArena {
    HostArena memory;  // reserved on the first allocation or share
    int64_t block_bytes = 0;
    int64_t segment_bytes = 0;
    int64_t per_segment = 0;  // blocks per segment
    std::vector<Segment> segments;
    std::vector<int64_t> unclaimed;  // LIFO; the lowest index on top at first
    // Claimed, every block free, none being trimmed: any owner may take them (SetEmptyLocked
    // keeps both and each owner's count).
    std::set<int64_t> empty;
    absl::flat_hash_map<int64_t, int32_t> empty_owner;
    std::vector<Owned> owners;  // by owner index
    int64_t releasing = 0;      // segments on their way back to `unclaimed`
  };

  HostBlockPool(const PoolOptions& options, kernels::KernelBackend* backend);
  absl::Status ReserveLocked(StorageFormat format) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int32_t OwnerLocked(const std::string& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Owned& OwnedLocked(FormatArena& a, int32_t owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Claims segment `s` for `owner` (a fresh memfd); its blocks become the owner's free ones.
  absl::Status ClaimLocked(FormatArena& a, int64_t s, int32_t owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A segment for `owner`: an unclaimed one, else another owner's empty one. Its blocks
  // join the owner's free ones; RESOURCE_EXHAUSTED when no memory can back it.
  absl::Status ClaimAnyLocked(FormatArena& a, int32_t owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `s` (claimed, every block free, none being trimmed) from its owner: its blocks
  // leave the owner's lists. The caller returns its pages, then UnclaimLocked.
  void DisownLocked(FormatArena& a, int64_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnclaimLocked(FormatArena& a, int64_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts `s` in or out of FormatArena::empty by its state now.
  void SetEmptyLocked(FormatArena& a, int64_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts free block `id` of claimed segment `s` on its lists (warm or cold).
  void ListFreeLocked(FormatArena& a, int64_t s, BlockId id, bool warm)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when the arenas may give pages back at all.
  bool trims() const { return keep_free_bytes_ < options_.capacity_bytes; }
  // One trimming step on `format`: a whole free segment, else a batch of warm blocks.
  // Returns bytes released, 0 when nothing was left to do.
  int64_t TrimStep(size_t format);
  void TrimmerLoop();

  const PoolOptions options_;
  kernels::KernelBackend* const backend_;
  const int64_t keep_free_bytes_;  // KeepFreeBytes(options_)
  mutable kvc::Mutex mu_;
  std::array<FormatArena, kernels::kNumStorageFormats> arenas_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int32_t> owner_ids_ ABSL_GUARDED_BY(mu_);
  uint64_t epochs_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t warm_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t claimed_ ABSL_GUARDED_BY(mu_) = 0;
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
