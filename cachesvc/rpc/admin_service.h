// gRPC AdminService over a KvStore: what kvcachectl and operators call.
#pragma once

#include <functional>

#include "cachesvc/core/store/kv_store.h"
#include "cachesvc/metrics/metrics.h"
#include "cachesvc/rpc/endpoints.h"
#include "cachesvc/security/access_control.h"
#include "kvcache/v1/admin_service.grpc.pb.h"

namespace kvc::cachesvc {

class AdminServiceImpl final : public kvcache::v1::AdminService::Service {
 public:
  // `metrics` may be null. `set_draining` switches the whole server (store, health,
  // metrics) into or out of draining.
  // `endpoints` (outliving the service): what GetServerInfo tells about the data paths.
  AdminServiceImpl(KvStore* store, Metrics* metrics, const AccessControl* access,
                   const Endpoints* endpoints, std::function<void(bool)> set_draining)
      : store_(store),
        metrics_(metrics),
        access_(access),
        endpoints_(endpoints),
        set_draining_(std::move(set_draining)) {}

  grpc::Status ListPools(grpc::ServerContext* context, const kvcache::v1::ListPoolsRequest* request,
                         kvcache::v1::ListPoolsResponse* response) override;
  grpc::Status GetPoolStats(grpc::ServerContext* context,
                            const kvcache::v1::GetPoolStatsRequest* request,
                            kvcache::v1::PoolStats* response) override;
  grpc::Status ListSequences(grpc::ServerContext* context,
                             const kvcache::v1::ListSequencesRequest* request,
                             kvcache::v1::ListSequencesResponse* response) override;
  grpc::Status EvictSequence(grpc::ServerContext* context,
                             const kvcache::v1::EvictSequenceRequest* request,
                             kvcache::v1::EvictSequenceResponse* response) override;
  grpc::Status Drain(grpc::ServerContext* context, const kvcache::v1::DrainRequest* request,
                     kvcache::v1::DrainResponse* response) override;
  grpc::Status ListTenants(grpc::ServerContext* context,
                           const kvcache::v1::ListTenantsRequest* request,
                           kvcache::v1::ListTenantsResponse* response) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context,
                             const kvcache::v1::GetServerInfoRequest* request,
                             kvcache::v1::ServerInfo* response) override;
  grpc::Status ListLeases(grpc::ServerContext* context,
                          const kvcache::v1::ListLeasesRequest* request,
                          kvcache::v1::ListLeasesResponse* response) override;
  grpc::Status EndLease(grpc::ServerContext* context, const kvcache::v1::EndLeaseRequest* request,
                        kvcache::v1::EndLeaseResponse* response) override;

 private:
  KvStore* store_;
  Metrics* metrics_;
  const AccessControl* access_;
  const Endpoints* endpoints_;
  std::function<void(bool)> set_draining_;
};

}  // namespace kvc::cachesvc
