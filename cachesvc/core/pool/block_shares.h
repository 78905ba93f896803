// BlockShares: which blocks of a pool are shared, by how many holders and of which kind. A
// block published in the prefix index is frozen: from then on no holder writes it in place (the
// lane planner copies it into a fresh block first: copy-on-write), so every sequence that
// attached it, and the index itself, keeps seeing the bytes that were checksummed. A published
// block stays frozen until its last holder drops it and it returns to the pool; a block frozen
// without a checksum (shared by a fork or pinned by a lease) thaws when one sequence is its only
// holder left. A block that was never frozen has exactly one holder (its sequence) and no entry
// here, so the append and compaction paths of unshared sequences pay one hash lookup per
// rewritten block at most. A published block also carries the checksum taken when it was
// published, so reads can re-verify it (shared_read_check.h), and a block found corrupt stays
// marked until it returns to the pool.
//
// Who pays for a block: its sequences' tenants (each sequence's account is charged for its
// blocks by the code that gives them to it). A block that leases pin and no sequence holds any
// more (the index may still hold it) is "lease-only": its bytes are charged to the lessee's
// account (LeaseCharge) from the moment its last sequence holder lets go until its last lease
// does (or a sequence attaches it again). Every change of who pays happens here, under the same
// lock as the holder change that causes it, so an account never misses or double counts a
// block. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "cachesvc/core/base/types.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

class TenantAccount;

// The kinds of holder a block has. A lease is a holder too, but pins through Pin/Unpin.
enum class Holder {
  kSequence,  // a sequence's storage lists it
  kIndex,     // a prefix-index entry (at most one per block)
};

// Who pays for a leased block once no sequence holds it: the leased sequence's account (the
// lease keeps it alive), the pool's index there, and the block's bytes.
struct LeaseCharge {
  TenantAccount* account = nullptr;  // null: nobody's (the pool's lease-only bytes still count)
  int pool = 0;
  int64_t block_bytes = 0;
};

class BlockShares {
 public:
  // Marks blocks immutable; each gains one holder of kind `holder` beyond its current ones (a
  // block not yet frozen has one: the sequence that wrote it).
  void Freeze(StorageFormat format, absl::Span<const BlockId> blocks, Holder holder);
  // A lease's hold: freezes the blocks (which a sequence holds now) with one more holder each,
  // charged to `charge` whenever no sequence holds the block any more.
  void Pin(StorageFormat format, absl::Span<const BlockId> blocks, const LeaseCharge& charge);
  // Ends one Pin of the same blocks with the same account; appends to `last` the blocks whose
  // last holder this was.
  void Unpin(StorageFormat format, absl::Span<const BlockId> blocks, const LeaseCharge& charge,
             std::vector<BlockId>* last);
  // Records checksums[i] (XXH64 of the block's bytes) for frozen blocks[i].
  void SetChecksums(StorageFormat format, absl::Span<const BlockId> blocks,
                    absl::Span<const uint64_t> checksums);
  // One more sequence holder for each block; every block must be frozen. A lease-only block
  // stops being charged to its lessee: the sequence's tenant pays for it from now on.
  void Hold(StorageFormat format, absl::Span<const BlockId> blocks);
  // Drops one holder of kind `holder` of each block; appends to `last` the blocks whose last
  // holder this was (the caller returns them to the pool). A block whose last sequence holder
  // this was and that a lease pins becomes lease-only: charged to its lessee.
  void Drop(StorageFormat format, absl::Span<const BlockId> blocks, Holder holder,
            std::vector<BlockId>* last);
  // Bytes of `blocks` that would become lease-only charged to `account` if one sequence holder
  // of each let go now: what a mutation that frees them does not take off its tenant.
  int64_t LeaseOnlyIfDropped(StorageFormat format, absl::Span<const BlockId> blocks,
                             const TenantAccount* account) const;
  // Bytes of `blocks` that are lease-only now.
  int64_t LeaseOnlyBytes(StorageFormat format, absl::Span<const BlockId> blocks) const;

  bool Frozen(StorageFormat format, BlockId block) const;
  // Frozen with a checksum: the prefix index holds it, or held it until the entry was dropped
  // (a fork freezes blocks without one).
  bool Published(StorageFormat format, BlockId block) const;
  // Appends the blocks among `blocks` that have a recorded checksum, and that checksum.
  void Checksummed(StorageFormat format, absl::Span<const BlockId> blocks,
                   std::vector<BlockId>* which, std::vector<uint64_t>* checksums) const;
  // Marks a frozen block corrupt: Corrupt() says so until its last holder drops it.
  void MarkCorrupt(StorageFormat format, BlockId block);
  bool Corrupt(StorageFormat format, BlockId block) const;
  // Blocks marked corrupt now, all formats. Lock-free read: readers skip the per-block
  // lookups while it is 0.
  int64_t corrupt_blocks() const { return corrupt_.load(std::memory_order_acquire); }
  // Holders of a block (1 for a block that was never frozen).
  int64_t Holders(StorageFormat format, BlockId block) const;
  // Frozen blocks now, all formats. Lock-free read.
  int64_t frozen_blocks() const { return frozen_.load(std::memory_order_relaxed); }
  // Blocks some lease pins now, and bytes of lease-only blocks now, all formats. Lock-free
  // reads (a mutation skips the per-block lookups while nothing is pinned).
  int64_t pinned_blocks() const { return pinned_.load(std::memory_order_acquire); }
  int64_t lease_only_bytes() const { return lease_only_bytes_.load(std::memory_order_relaxed); }

 private:
  // The leases of one account that pin a block.
  struct Lessee {
    LeaseCharge charge;
    int32_t leases = 0;
  };
  struct Share {
    int32_t holders = 1;   // all kinds
    int32_t leases = 0;    // of which leases
    bool indexed = false;  // one of them is the prefix index
    bool has_checksum = false;
    bool corrupt = false;
    uint64_t checksum = 0;
    // Non-empty while leases pin it; the first pays while the block is lease-only.
    absl::InlinedVector<Lessee, 1> lessees;

    int32_t sequences() const { return holders - leases - (indexed ? 1 : 0); }
    // Who pays for the block as a lease-only block now (null: its sequences' tenants do).
    const LeaseCharge* payer() const {
      return sequences() == 0 && !lessees.empty() ? &lessees.front().charge : nullptr;
    }
  };
  // Moves the charge of a block whose payer was `before` (a copy, or none) to its payer now.
  void Recharge(const std::optional<LeaseCharge>& before, const LeaseCharge* after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a holder left `it`: erases a share that returned to the pool (appending it to
  // `last`) or that one sequence alone holds again (thawed).
  void ReleaseIfDone(absl::flat_hash_map<BlockId, Share>& map,
                     absl::flat_hash_map<BlockId, Share>::iterator it, BlockId block,
                     std::vector<BlockId>* last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable kvc::Mutex mu_;
  std::array<absl::flat_hash_map<BlockId, Share>, kernels::kNumStorageFormats> shares_
      ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> frozen_{0};
  std::atomic<int64_t> corrupt_{0};
  std::atomic<int64_t> pinned_{0};
  std::atomic<int64_t> lease_only_bytes_{0};
};

}  // namespace kvc::cachesvc
