// AdminClient: AdminService (and GetSequence with a tenant) over a KvCacheClient::Impl, its own
// or a KvCacheClient's, each call through Impl::Call (client_impl.h) as KvCacheClient's are.
#include "kvc/client/admin_client.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/src/client_impl.h"
#include "client/src/convert.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"

namespace kvc::client {

namespace pb = ::kvcache::v1;
using internal::FromProto;

absl::StatusOr<std::unique_ptr<AdminClient>> AdminClient::Connect(const ClientOptions& options) {
  auto impl = internal::NewImpl(options);
  if (!impl.ok()) return impl.status();
  const KvCacheClient::Impl* state = impl->get();
  return std::unique_ptr<AdminClient>(new AdminClient(*std::move(impl), state));
}

AdminClient AdminClient::Over(const KvCacheClient& client) {
  return AdminClient(nullptr, &client.state());
}

AdminClient::AdminClient(std::unique_ptr<KvCacheClient::Impl> owned,
                         const KvCacheClient::Impl* state)
    : owned_(std::move(owned)), state_(state) {}
AdminClient::AdminClient(AdminClient&&) noexcept = default;
AdminClient& AdminClient::operator=(AdminClient&&) noexcept = default;
AdminClient::~AdminClient() = default;

const ClientOptions& AdminClient::options() const { return state_->options; }

absl::StatusOr<std::vector<PoolInfo>> AdminClient::ListPools(const CallOptions& call) const {
  pb::ListPoolsResponse response;
  const absl::Status status =
      state_->Call(&StubAdmin::ListPools, pb::ListPoolsRequest(), &response, call, Retried::kYes);
  if (!status.ok()) return status;
  std::vector<PoolInfo> pools;
  pools.reserve(response.pools_size());
  for (const auto& pool : response.pools()) pools.push_back(FromProto(pool));
  return pools;
}

absl::StatusOr<PoolStats> AdminClient::GetPoolStats(const std::string& pool,
                                                    const CallOptions& call) const {
  pb::GetPoolStatsRequest request;
  request.set_pool(pool);
  pb::PoolStats response;
  const absl::Status status =
      state_->Call(&StubAdmin::GetPoolStats, request, &response, call, Retried::kYes);
  if (!status.ok()) return status;
  return FromProto(response);
}

absl::StatusOr<SequenceList> AdminClient::ListSequences(const ListSequencesOptions& options,
                                                        const CallOptions& call) const {
  pb::ListSequencesRequest request;
  request.set_pool(options.pool);
  request.set_tenant(options.tenant);
  request.set_limit(options.limit);
  request.set_page_token(options.page_token);
  pb::ListSequencesResponse response;
  const absl::Status status =
      state_->Call(&StubAdmin::ListSequences, request, &response, call, Retried::kYes);
  if (!status.ok()) return status;
  SequenceList list;
  list.sequences.reserve(response.sequences_size());
  for (const auto& s : response.sequences()) list.sequences.push_back(FromProto(s));
  list.total = response.total();
  list.next_page_token = response.next_page_token();
  return list;
}

absl::StatusOr<SequenceInfo> AdminClient::GetSequence(const std::string& sequence_id,
                                                      const std::string& tenant,
                                                      const CallOptions& call) const {
  pb::GetSequenceRequest request;
  request.set_sequence_id(sequence_id);
  request.set_tenant(tenant);
  pb::SequenceInfo response;
  const absl::Status status =
      state_->Call(&StubKv::GetSequence, request, &response, call, Retried::kYes);
  if (!status.ok()) return status;
  return FromProto(response);
}

absl::StatusOr<EvictResult> AdminClient::EvictSequence(const std::string& sequence_id,
                                                       const std::string& tenant,
                                                       const CallOptions& call) const {
  pb::EvictSequenceRequest request;
  request.set_sequence_id(sequence_id);
  request.set_tenant(tenant);
  pb::EvictSequenceResponse response;
  const absl::Status status =
      state_->Call(&StubAdmin::EvictSequence, request, &response, call, Retried::kNo);
  if (!status.ok()) return status;
  return EvictResult{response.freed_blocks(), response.freed_bytes()};
}

absl::StatusOr<std::vector<TenantUsage>> AdminClient::ListTenants(const CallOptions& call) const {
  pb::ListTenantsResponse response;
  const absl::Status status = state_->Call(&StubAdmin::ListTenants, pb::ListTenantsRequest(),
                                           &response, call, Retried::kYes);
  if (!status.ok()) return status;
  std::vector<TenantUsage> out;
  out.reserve(response.tenants_size());
  for (const auto& t : response.tenants()) out.push_back(FromProto(t));
  return out;
}

absl::StatusOr<std::vector<LeaseInfo>> AdminClient::ListLeases(const std::string& tenant,
                                                               const std::string& pool,
                                                               const CallOptions& call) const {
  pb::ListLeasesRequest request;
  request.set_tenant(tenant);
  request.set_pool(pool);
  pb::ListLeasesResponse response;
  const absl::Status status =
      state_->Call(&StubAdmin::ListLeases, request, &response, call, Retried::kYes);
  if (!status.ok()) return status;
  std::vector<LeaseInfo> out;
  out.reserve(response.leases_size());
  for (const auto& l : response.leases()) out.push_back(FromProto(l));
  return out;
}

absl::StatusOr<int64_t> AdminClient::EndLease(const std::string& tenant,
                                              const std::string& lease_id,
                                              const CallOptions& call) const {
  pb::EndLeaseRequest request;
  request.set_tenant(tenant);
  request.set_lease_id(lease_id);
  pb::EndLeaseResponse response;
  const absl::Status status =
      state_->Call(&StubAdmin::EndLease, request, &response, call, Retried::kNo);
  if (!status.ok()) return status;
  return response.freed_blocks();
}

absl::StatusOr<DrainResult> AdminClient::Drain(bool resume, const CallOptions& call) const {
  pb::DrainRequest request;
  request.set_resume(resume);
  pb::DrainResponse response;
  // Idempotent (it sets a state), so retried like the reads.
  const absl::Status status =
      state_->Call(&StubAdmin::Drain, request, &response, call, Retried::kYes);
  if (!status.ok()) return status;
  return DrainResult{response.draining(), response.sequences()};
}

absl::StatusOr<ServerInfo> AdminClient::GetServerInfo(const CallOptions& call) const {
  pb::ServerInfo response;
  const absl::Status status = state_->Call(&StubAdmin::GetServerInfo, pb::GetServerInfoRequest(),
                                           &response, call, Retried::kYes);
  if (!status.ok()) return status;
  return FromProto(response);
}

}  // namespace kvc::client
