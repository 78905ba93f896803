#include "cachesvc/rpc/admin_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "cachesvc/rpc/handler_macros.h"
#include "cachesvc/rpc/proto_convert.h"
#include "cachesvc/rpc/rpc_scope.h"
#include "proto/rpc_status.h"

namespace kvc::cachesvc {

namespace pb = ::kvcache::v1;
constexpr char kAdminService[] = "AdminService";

grpc::Status AdminServiceImpl::ListPools(grpc::ServerContext* context, const pb::ListPoolsRequest*,
                                         pb::ListPoolsResponse* response) {
  RpcScope scope(metrics_, kAdminService, "ListPools");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  // Pool shapes and sizes are configuration, not any tenant's data; every tenant needs them.
  for (PoolSnapshot& pool : store_->stats().ListPools()) {
    if (!caller.admin()) pool.used_bytes = pool.sequences = pool.free_blocks = 0;
    ToProto(pool, response->add_pools());
  }
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::GetPoolStats(grpc::ServerContext* context,
                                            const pb::GetPoolStatsRequest* request,
                                            pb::PoolStats* response) {
  RpcScope scope(metrics_, kAdminService, "GetPoolStats");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  // A tenant sees its own use and limits, not the pool's: other tenants' activity is theirs.
  KVC_ASSIGN_OR_FINISH(const PoolStatsSnapshot stats,
                       caller.admin()
                           ? store_->stats().GetPoolStats(request->pool())
                           : store_->stats().TenantPoolStats(caller.tenant, request->pool()));
  ToProto(stats, response);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::ListSequences(grpc::ServerContext* context,
                                             const pb::ListSequencesRequest* request,
                                             pb::ListSequencesResponse* response) {
  RpcScope scope(metrics_, kAdminService, "ListSequences");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  ListSequencesParams params;
  params.pool = request->pool();
  params.tenant = request->tenant();
  params.limit = request->limit();
  params.page_token = request->page_token();
  if (caller.authenticated && caller.role != Role::kAdmin) {
    KVC_ASSIGN_OR_FINISH(params.scope,
                         access_->ScopeFor(caller, request->tenant(), "ListSequences"));
  }
  KVC_ASSIGN_OR_FINISH(const SequenceList list, store_->stats().ListSequences(params));
  for (const SequenceSnapshot& s : list.sequences) ToProto(s, response->add_sequences());
  response->set_total(list.total);
  response->set_next_page_token(list.next_page_token);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::EvictSequence(grpc::ServerContext* context,
                                             const pb::EvictSequenceRequest* request,
                                             pb::EvictSequenceResponse* response) {
  RpcScope scope(metrics_, kAdminService, "EvictSequence");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  const std::string tenant = request->tenant().empty() ? caller.tenant : request->tenant();
  KVC_FINISH_IF_ERROR(access_->RequireAdmin(
      caller, "EvictSequence",
      absl::StrCat(Quoted(request->sequence_id()), " of tenant ", Quoted(tenant))));
  const TenantScope tenant_scope(caller.authenticated ? tenant : "");
  KVC_ASSIGN_OR_FINISH(const ReleaseResult evicted,
                       store_->Evict(request->sequence_id(), tenant_scope));
  response->set_freed_blocks(evicted.freed_blocks);
  response->set_freed_bytes(evicted.freed_bytes);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::ListLeases(grpc::ServerContext* context,
                                          const pb::ListLeasesRequest* request,
                                          pb::ListLeasesResponse* response) {
  RpcScope scope(metrics_, kAdminService, "ListLeases");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  ListLeasesParams params;
  params.pool = request->pool();
  if (caller.authenticated && caller.role != Role::kAdmin) {
    // A tenant sees its own leases only, as its own sequences (ListSequences).
    KVC_ASSIGN_OR_FINISH(params.scope, access_->ScopeFor(caller, request->tenant(), "ListLeases"));
  } else {
    params.tenant = request->tenant();
  }
  KVC_ASSIGN_OR_FINISH(const std::vector<LeaseInfo> leases, store_->leases().ListLeases(params));
  for (const LeaseInfo& l : leases) ToProto(l, response->add_leases());
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::EndLease(grpc::ServerContext* context,
                                        const pb::EndLeaseRequest* request,
                                        pb::EndLeaseResponse* response) {
  RpcScope scope(metrics_, kAdminService, "EndLease");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  const std::string tenant = request->tenant().empty() ? caller.tenant : request->tenant();
  KVC_FINISH_IF_ERROR(access_->RequireAdmin(
      caller, "EndLease",
      absl::StrCat(Quoted(request->lease_id()), " of tenant ", Quoted(tenant))));
  const TenantScope tenant_scope(caller.authenticated ? tenant : "");
  KVC_ASSIGN_OR_FINISH(const int64_t freed,
                       store_->leases().ReleaseLease(tenant_scope, request->lease_id()));
  response->set_freed_blocks(freed);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::Drain(grpc::ServerContext* context, const pb::DrainRequest* request,
                                     pb::DrainResponse* response) {
  RpcScope scope(metrics_, kAdminService, "Drain");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_FINISH_IF_ERROR(
      access_->RequireAdmin(caller, request->resume() ? "Drain (resume)" : "Drain", ""));
  set_draining_(!request->resume());
  response->set_draining(store_->stats().draining());
  auto stats = store_->stats().GetPoolStats("");
  if (stats.ok()) response->set_sequences(stats->sequences);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::GetServerInfo(grpc::ServerContext* context,
                                             const pb::GetServerInfoRequest*,
                                             pb::ServerInfo* response) {
  RpcScope scope(metrics_, kAdminService, "GetServerInfo");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  // Identity, not data: every tenant's cluster client needs it to route its own sequences.
  (void)caller;
  const ShardIdentity& shard = store_->stats().shard();
  response->set_shard(shard.name());
  response->set_incarnation(shard.incarnation());
  response->set_weight(shard.weight());
  response->set_draining(store_->stats().draining());
  response->set_started_unix_ms(shard.started_unix_ms());
  response->set_local_socket(endpoints_->local_socket);
  response->set_local_token(endpoints_->local_token);
  response->set_transfer_port(endpoints_->transfer_port);
  response->set_nccl_transfers(endpoints_->nccl_transfers);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::ListTenants(grpc::ServerContext* context,
                                           const pb::ListTenantsRequest*,
                                           pb::ListTenantsResponse* response) {
  RpcScope scope(metrics_, kAdminService, "ListTenants");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  std::vector<TenantUsageSnapshot> tenants = store_->stats().TenantUsage();
  // Tenants with a quota entry of their own are listed while they hold nothing, too.
  for (const TenantQuota& q : store_->stats().quotas()) {
    if (q.tenant == "*") continue;
    bool listed = false;
    for (const auto& t : tenants) listed = listed || t.tenant == q.tenant;
    if (!listed) tenants.push_back({q.tenant, 0, {}, q, {}});
  }
  std::sort(tenants.begin(), tenants.end(),
            [](const auto& a, const auto& b) { return a.tenant < b.tenant; });
  const std::vector<PoolSnapshot> pools = store_->stats().ListPools();
  for (const TenantUsageSnapshot& t : tenants) {
    if (!caller.admin() && t.tenant != caller.tenant) continue;
    pb::TenantUsage* out = response->add_tenants();
    out->set_tenant(t.tenant);
    out->set_sequences(t.sequences);
    for (size_t i = 0; i < pools.size(); ++i) {
      (*out->mutable_pool_bytes())[pools[i].options.name] =
          i < t.pool_bytes.size() ? t.pool_bytes[i] : 0;
    }
    out->set_open_streams(access_->InFlight(t.tenant, CallKind::kStream));
    out->set_compute_calls(access_->InFlight(t.tenant, CallKind::kCompute));
    out->set_quota_bytes_per_pool(t.quota.max_bytes_per_pool);
    out->set_quota_sequences(t.quota.max_sequences);
    out->set_quota_streams(t.quota.max_streams);
    out->set_quota_compute_calls(t.quota.max_compute_calls);
    for (size_t i = 0; i < pools.size() && i < t.lease_only_bytes.size(); ++i) {
      if (t.lease_only_bytes[i] != 0) {
        (*out->mutable_lease_only_bytes())[pools[i].options.name] = t.lease_only_bytes[i];
      }
    }
  }
  if (!caller.admin() && response->tenants_size() == 0) {
    // A tenant that holds nothing still learns its limits.
    const TenantQuota q = QuotaFor(store_->stats().quotas(), caller.tenant);
    pb::TenantUsage* out = response->add_tenants();
    out->set_tenant(caller.tenant);
    out->set_quota_bytes_per_pool(q.max_bytes_per_pool);
    out->set_quota_sequences(q.max_sequences);
    out->set_quota_streams(q.max_streams);
    out->set_quota_compute_calls(q.max_compute_calls);
  }
  return scope.Finish(grpc::Status::OK);
}

}  // namespace kvc::cachesvc
