// AdminClient: the operator-facing C++ API of kvcache (AdminService, and GetSequence on any
// tenant's sequence). kvcachectl is built on it; engines use KvCacheClient.
//
//   auto admin = kvc::client::AdminClient::Connect({.target = "127.0.0.1:50051"});
//   auto pools = (*admin)->ListPools();
//   auto stats = (*admin)->GetPoolStats("default");
//
// Code that holds a KvCacheClient reaches the same server over the client's channel, with no
// second connection: AdminClient::Over(client).GetServerInfo().
//
// The options, deadlines, TLS and token are KvCacheClient's (kvc/client/options.h); statuses
// are the service's. Only idempotent calls (the reads, and Drain, which sets a state) are
// retried, and only on UNAVAILABLE, with exponential backoff. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvc/client/kv_cache_client.h"
#include "kvc/client/options.h"
#include "kvc/client/types.h"

namespace kvc::client {

class AdminClient {
 public:
  // As KvCacheClient::Connect: a lazy channel; INVALID_ARGUMENT for bad options or an
  // unreadable TLS file.
  static absl::StatusOr<std::unique_ptr<AdminClient>> Connect(const ClientOptions& options);
  // Admin calls over `client`'s channel and options; `client` must outlive the AdminClient.
  static AdminClient Over(const KvCacheClient& client);
  AdminClient(AdminClient&&) noexcept;
  AdminClient& operator=(AdminClient&&) noexcept;
  AdminClient(const AdminClient&) = delete;
  AdminClient& operator=(const AdminClient&) = delete;
  ~AdminClient();

  absl::StatusOr<std::vector<PoolInfo>> ListPools(const CallOptions& call = {}) const;
  // One pool's statistics, or every pool summed (pool ""). With authentication on, a
  // non-admin gets its own use and limits (PoolStats::tenant set).
  absl::StatusOr<PoolStats> GetPoolStats(const std::string& pool,
                                         const CallOptions& call = {}) const;
  // A page of the live sequences, in creation order.
  absl::StatusOr<SequenceList> ListSequences(const ListSequencesOptions& options,
                                             const CallOptions& call = {}) const;
  // One sequence; `tenant` names whose it is when an admin looks at another tenant's ("" =
  // the caller's own).
  absl::StatusOr<SequenceInfo> GetSequence(const std::string& sequence_id,
                                           const std::string& tenant = "",
                                           const CallOptions& call = {}) const;
  // Frees a sequence on an operator's behalf (counted as evicted); `tenant` as GetSequence's.
  // NOT_FOUND when absent. Not retried: a retry after a lost reply would be NOT_FOUND.
  absl::StatusOr<EvictResult> EvictSequence(const std::string& sequence_id,
                                            const std::string& tenant = "",
                                            const CallOptions& call = {}) const;
  // Every tenant's holdings and quotas (an admin, or authentication off), else the caller's.
  absl::StatusOr<std::vector<TenantUsage>> ListTenants(const CallOptions& call = {}) const;
  // The live leases, oldest first; "" = every tenant (pool). A non-admin sees its own.
  absl::StatusOr<std::vector<LeaseInfo>> ListLeases(const std::string& tenant = "",
                                                    const std::string& pool = "",
                                                    const CallOptions& call = {}) const;
  // Ends `tenant`'s lease at once (admin only); returns the blocks that went back to the
  // pool. Not retried.
  absl::StatusOr<int64_t> EndLease(const std::string& tenant, const std::string& lease_id,
                                   const CallOptions& call = {}) const;
  // Stops (resume = false) or restarts (resume = true) taking new sequences; the server's
  // sequences keep working either way. Admin only.
  absl::StatusOr<DrainResult> Drain(bool resume, const CallOptions& call = {}) const;
  // The server's cluster identity (shard name, incarnation, weight), draining state and the
  // data paths it offers.
  absl::StatusOr<ServerInfo> GetServerInfo(const CallOptions& call = {}) const;

  const ClientOptions& options() const;

 private:
  AdminClient(std::unique_ptr<KvCacheClient::Impl> owned, const KvCacheClient::Impl* state);
  std::unique_ptr<KvCacheClient::Impl> owned_;  // null when over a KvCacheClient
  const KvCacheClient::Impl* state_;
};

}  // namespace kvc::client
