#include "cachesvc/rpc/admin_service.h"

#include "cachesvc/rpc/proto_convert.h"
#include "proto/rpc_status.h"

namespace kvc::cachesvc {

namespace pb = ::kvcache::v1;

grpc::Status AdminServiceImpl::ListPools(grpc::ServerContext*, const pb::ListPoolsRequest*,
                                         pb::ListPoolsResponse* response) {
  for (const PoolSnapshot& pool : store_->ListPools()) ToProto(pool, response->add_pools());
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::GetPoolStats(grpc::ServerContext*,
                                            const pb::GetPoolStatsRequest* request,
                                            pb::PoolStats* response) {
  auto stats = store_->GetPoolStats(request->pool());
  if (!stats.ok()) return ToGrpcStatus(stats.status());
  ToProto(*stats, response);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::ListSequences(grpc::ServerContext*,
                                             const pb::ListSequencesRequest* request,
                                             pb::ListSequencesResponse* response) {
  ListSequencesParams params;
  params.pool = request->pool();
  params.tenant = request->tenant();
  params.limit = request->limit();
  auto list = store_->ListSequences(params);
  if (!list.ok()) return ToGrpcStatus(list.status());
  for (const SequenceSnapshot& s : list->sequences) ToProto(s, response->add_sequences());
  response->set_total(list->total);
  return grpc::Status::OK;
}

}  // namespace kvc::cachesvc
