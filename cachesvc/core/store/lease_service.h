// LeaseService: the leases over a KvStore's sequences (lease_table.h) and what a reader of a
// lease needs from the pools. LeaseSequence pins every block the sequence's requested layers
// hold now and describes where each lane's records are; nothing described changes until the
// lease ends (mutations of the sequence copy a leased block before writing it, and Release
// leaves leased blocks to the lease). The transports (cachesvc/transport/) read through it.
// Thread-safe, as KvStore.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cachesvc/core/base/requests.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/base/types.h"
#include "cachesvc/core/base/unique_fd.h"
#include "cachesvc/core/lease/lease_table.h"
#include "cachesvc/core/store/store_parts.h"

namespace kvc::cachesvc {

class LeaseService {
 public:
  explicit LeaseService(StoreParts& parts) : parts_(parts) {}

  // NOT_FOUND, INVALID_ARGUMENT (layers, TTL), RESOURCE_EXHAUSTED (too many leases in this
  // scope).
  absl::StatusOr<LeaseSnapshot> LeaseSequence(const LeaseParams& params);
  // The new expiry (unix ms). NOT_FOUND for an unknown, ended or expired lease.
  absl::StatusOr<int64_t> RenewLease(const TenantScope& scope, const std::string& lease_id,
                                     int64_t ttl_ms);
  // Ends the lease at once; returns the blocks that went back to the pool. An operator ends
  // another tenant's lease by naming that tenant's scope.
  absl::StatusOr<int64_t> ReleaseLease(const TenantScope& scope, const std::string& lease_id);
  // The live leases of a scope (unset: every scope) and pool (empty: every pool), oldest
  // first; NOT_FOUND for an unknown pool. Neither this nor any other lookup extends a lease.
  absl::StatusOr<std::vector<LeaseInfo>> ListLeases(const ListLeasesParams& params) const;
  // What a live lease of `scope` pins, for a reader that copies its blocks
  // (cachesvc/transport/lease_sender.h); NOT_FOUND unless the lease is live now.
  absl::StatusOr<LeaseTable::Pinned> PinnedLease(const TenantScope& scope,
                                                 const std::string& lease_id) const;
  // Whether the lease is live now: live after a copy of its blocks finished means pinned
  // throughout it (an ended lease never comes back).
  bool LeaseLive(const TenantScope& scope, const std::string& lease_id) const;
  // Same-node readers acting for `scope` (cachesvc/transport/local_socket.h;
  // BlockPool::ShareArena and ShareSegment): the shape of one arena of pool `pool` (empty =
  // default), and a read-only descriptor of one of its segments holding that scope's blocks
  // now. NOT_FOUND pool; FAILED_PRECONDITION not shareable, or not the scope's segment (at
  // that epoch).
  absl::StatusOr<SharedArena> ShareArena(const std::string& pool, StorageFormat format,
                                         const TenantScope& scope);
  absl::StatusOr<UniqueFd> ShareSegment(const std::string& pool, StorageFormat format,
                                        const TenantScope& scope, int64_t index, uint64_t epoch);
  // The pool named `name` (empty = default) whose memory a lease's reader copies from
  // (device sends), or NOT_FOUND listing the pools.
  absl::StatusOr<BlockPool*> FindPool(const std::string& name) const {
    return parts_.FindPool(name);
  }

 private:
  StoreParts& parts_;
};

}  // namespace kvc::cachesvc
