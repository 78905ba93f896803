// Transaction: runs the lane plans of one mutation of one sequence (lane_plan.h) and
// publishes them together. Execute() allocates every fresh block through BlockReservations and runs
// the kernel phases; it writes only memory no stored token occupies, except the single
// in-place move op at the end, so on any error (a full pool, a failed kernel op) the
// sequence and the pool are exactly as before. Commit() cannot fail: it swaps in the new
// segments, frees what the plans freed and bumps the generation of every layer where a
// stored token moved or went away. The caller holds the sequence's lock throughout (except,
// for a transaction that does not write in place, across Execute: see WritesInPlace).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "cachesvc/core/plan/lane_plan.h"
#include "cachesvc/core/pool/block_pool.h"
#include "cachesvc/core/pool/block_reservation.h"
#include "cachesvc/core/sequence/sequence_storage.h"
#include "cachesvc/core/tenant/tenant_account.h"

namespace kvc::cachesvc {

class OpStage;

// Rows appended by the request: row r of a lane is `row_stride` elements after row r - 1,
// starting `lane_offset` elements (AddLane) into keys and values.
struct IncomingRows {
  DType dtype = DType::kF16;
  const char* keys = nullptr;
  const char* values = nullptr;
  size_t bytes = 0;  // of keys, and of values
  int64_t row_stride = 0;
  bool on_device = false;  // keys and values are already memory of the pool's backend
};

class Transaction {
 public:
  // `charge`: the tenant account that pays for the blocks (none = nobody's).
  Transaction(BlockPool* pool, SequenceStorage* storage, TenantCharge charge = {})
      : pool_(pool), storage_(storage), charge_(charge) {}
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  // Returns an unused quota reservation (the blocks go back when their BlockReservations are
  // destroyed).
  ~Transaction();

  void SetIncoming(const IncomingRows& rows) { incoming_ = rows; }
  // Adds the plan of lane `lane` of the storage; its incoming rows start `lane_offset`
  // elements into the incoming keys and values.
  void AddLane(int lane, LanePlan plan, int64_t lane_offset = 0);
  // The tier list to publish with the lanes (a Compress that converts or adds a residual).
  void SetTiers(std::vector<Tier> tiers) { tiers_ = std::move(tiers); }

  // True when Execute would change memory a stored token occupies (compaction moves, RoPE
  // rotations in place): such a transaction must run with the sequence's lock held
  // throughout. Otherwise Execute writes only fresh blocks and unoccupied slots, and reads
  // only the planned lanes' stored tokens, so it may run with the lock released as long as
  // nothing else changes those lanes (a two-phase Append, sequence.h).
  bool WritesInPlace() const;

  // Allocates and writes. RESOURCE_EXHAUSTED when the pool cannot hold the fresh blocks or
  // the tenant's quota would be passed once the mutation's freed blocks are returned,
  // INTERNAL when a kernel op fails; either way nothing changed.
  absl::Status Execute();
  // Publishes; requires a successful Execute().
  void Commit();

 private:
  struct Lane {
    int lane = 0;
    LanePlan plan;
    int64_t lane_offset = 0;
    std::vector<int64_t> fresh_base;  // per segment: its first block in its format's reservation
  };
  BlockReservation& ReservationFor(StorageFormat format);
  BlockId Resolve(const Lane& lane, size_t segment, const BlockRef& ref) const;
  absl::Status RunOps(OpStage& stage);
  absl::Status RunConverts(OpStage& stage);
  absl::Status RunCopies(OpStage& stage, std::vector<PlannedCopy> SegmentPlan::*list,
                         const char* what);
  absl::Status RunWrites(OpStage& stage);
  absl::Status RunRotations(OpStage& stage);

  // Bytes the plans allocate minus those they free: the sequence's change at commit.
  int64_t NetBytes() const;
  // Bytes of the freed blocks that leases of the charged tenant would keep (lease-only, still
  // on its account) if the commit ran now.
  int64_t StaysLeased() const;

  BlockPool* pool_;
  SequenceStorage* storage_;
  TenantCharge charge_;
  int64_t reserved_ = 0;  // quota reserved in Execute (net_bytes_ + StaysLeased), settled in Commit
  int64_t net_bytes_ = 0;
  IncomingRows incoming_;
  std::vector<Lane> lanes_;
  std::optional<std::vector<Tier>> tiers_;
  std::vector<BlockReservation> reservations_;
  bool executed_ = false;
};

}  // namespace kvc::cachesvc
