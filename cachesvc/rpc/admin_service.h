// gRPC AdminService over a KvStore: what kvcachectl and operators call.
#pragma once

#include "cachesvc/core/kv_store.h"
#include "kvcache/v1/admin_service.grpc.pb.h"

namespace kvc::cachesvc {

class AdminServiceImpl final : public kvcache::v1::AdminService::Service {
 public:
  explicit AdminServiceImpl(KvStore* store) : store_(store) {}

  grpc::Status ListPools(grpc::ServerContext* context, const kvcache::v1::ListPoolsRequest* request,
                         kvcache::v1::ListPoolsResponse* response) override;
  grpc::Status GetPoolStats(grpc::ServerContext* context,
                            const kvcache::v1::GetPoolStatsRequest* request,
                            kvcache::v1::PoolStats* response) override;
  grpc::Status ListSequences(grpc::ServerContext* context,
                             const kvcache::v1::ListSequencesRequest* request,
                             kvcache::v1::ListSequencesResponse* response) override;

 private:
  KvStore* store_;
};

}  // namespace kvc::cachesvc
