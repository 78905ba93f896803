// LeaseTable: the leases a store has granted. A lease pins the blocks a sequence held when it
// was granted: each block gains one holder (BlockShares, frozen), so from then on no
// mutation of the sequence writes a leased record in place (the lane planner copies it
// first: copy-on-write), and Release or eviction of the sequence leaves the leased blocks to
// the lease. A reader that maps the pool (same node) or opens it by IPC reads the described
// records for as long as the lease lives. The blocks return to the pool when the lease is
// released or expires; a client that dies without releasing pins them for its TTL at most,
// and no lease lives longer than max_lifetime_ms however often it is renewed. A reaper thread
// ends expired leases, so expiry needs no client call.
//
// Accounting: a lease holds the leased sequence's TenantAccount (so the account outlives the
// tenant's last sequence) and pins its blocks with that account as their payer: a block that no
// sequence holds any more stays on the account until the lease lets go (BlockShares). Granting
// a lease adds nothing to the account (the sequence already pays for every block), so a lease is
// never refused for quota. Thread-safe; mu_ is never held while another lock is taken.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/base/requests.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/base/types.h"
#include "cachesvc/core/pool/block_pool.h"
#include "cachesvc/core/tenant/tenant_account.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

struct LeaseLimits {
  int64_t default_ttl_ms = 30000;
  int64_t max_ttl_ms = 300000;
  // Live leases per scope (tenant): what one client can pin is bounded by this, the TTL,
  // and its sequences' size.
  int64_t max_per_scope = 256;
  // No lease lives longer than this after it was granted, however often it is renewed: a
  // reader that needs the blocks longer leases the sequence again (a new snapshot, charged as
  // any lease).
  int64_t max_lifetime_ms = 600000;
};

class LeaseTable {
 public:
  // `num_pools`: how many pools the store has (pool_index below counts them); the pools a
  // lease names outlive the table.
  LeaseTable(const LeaseLimits& limits, int num_pools);
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;
  // Stops the reaper and ends every lease (their blocks go back to the pools).
  ~LeaseTable();

  // INVALID_ARGUMENT for a TTL out of [1, max_ttl_ms]; RESOURCE_EXHAUSTED when the scope has
  // max_per_scope leases. The TTL the lease would get (0 = default; at most max_lifetime_ms).
  absl::StatusOr<int64_t> CheckNew(const TenantScope& scope, int64_t ttl_ms) const;
  using PerFormat = std::array<std::vector<BlockId>, kernels::kNumStorageFormats>;
  // What the pin of a lease's blocks of `format` charges (BlockShares::Pin, Unpin).
  static LeaseCharge ChargeFor(TenantAccount* account, BlockPool* pool, int pool_index,
                               StorageFormat format);
  // Who a new lease is for: its scope, the leased sequence and the account that pays.
  struct Lessee {
    TenantScope scope;
    std::string sequence_id;
    std::shared_ptr<TenantAccount> account;  // may be null: nobody pays
  };
  // Records a lease whose blocks (`held`, per format, in lease order) the caller has already
  // pinned for it (BlockShares::Pin with ChargeFor(lessee.account)); `slots[f][i]`: how many
  // leading token slots of held[f][i] the lease describes. Fills lease_id and expires_unix_ms.
  // Cannot fail.
  void Add(Lessee lessee, BlockPool* pool, int pool_index, PerFormat held, PerFormat slots,
           LeaseSnapshot* lease);
  // What a live lease holds, for a reader that copies its blocks (SendLease).
  struct Pinned {
    BlockPool* pool = nullptr;
    PerFormat held;
    PerFormat slots;
  };
  // NOT_FOUND (as Renew) unless the lease is live now.
  absl::StatusOr<Pinned> Find(const TenantScope& scope, const std::string& lease_id) const;
  // Whether the lease is live now. A lease that was live after a copy of its blocks finished
  // was live throughout it (an ended lease never comes back), so nothing was recycled.
  bool Live(const TenantScope& scope, const std::string& lease_id) const;
  // NOT_FOUND (a lease of another scope is unknown too) or expired; FAILED_PRECONDITION once
  // its expiry is max_lifetime_ms after it was granted; else the new expiry, never past that.
  absl::StatusOr<int64_t> Renew(const TenantScope& scope, const std::string& lease_id,
                                int64_t ttl_ms);
  // Ends the lease; returns how many of its blocks went back to the pool (those no sequence
  // holds any more).
  absl::StatusOr<int64_t> Release(const TenantScope& scope, const std::string& lease_id);
  // Ends every lease whose TTL has passed; returns how many.
  int64_t ExpireDue();

  LeaseStats Stats(int pool_index) const;
  // The live leases of one scope (unset: all) and pool (-1: all), oldest first. Looks at
  // every lease's blocks (their lease-only bytes): for operators, not a data path.
  std::vector<LeaseInfo> List(const std::optional<TenantScope>& scope, int pool_index) const;

 private:
  struct Lease {
    Lessee lessee;
    BlockPool* pool = nullptr;
    int pool_index = 0;
    int64_t granted_ms = 0;
    int64_t expires_ms = 0;
    int64_t renewals = 0;
    int64_t bytes = 0;
    PerFormat held;
    PerFormat slots;
  };
  struct Counters {
    int64_t active = 0, bytes = 0, granted = 0, renewed = 0, released = 0, expired = 0;
  };
  // Drops the lease's holders (outside mu_); returns the blocks that went back to the pool.
  static int64_t Drop(Lease& lease);
  absl::StatusOr<int64_t> CheckTtl(int64_t ttl_ms) const;
  void ReaperLoop();

  const LeaseLimits limits_;
  mutable kvc::Mutex mu_;
  absl::flat_hash_map<std::string, Lease> leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TenantScope, int64_t> per_scope_ ABSL_GUARDED_BY(mu_);
  std::vector<Counters> counters_ ABSL_GUARDED_BY(mu_);  // [pool]

  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;
  bool stop_ = false;  // guarded by reaper_mu_
  std::thread reaper_;
};

}  // namespace kvc::cachesvc
