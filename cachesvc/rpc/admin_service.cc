#include "cachesvc/rpc/admin_service.h"

#include "cachesvc/rpc/proto_convert.h"
#include "cachesvc/rpc/rpc_scope.h"
#include "proto/rpc_status.h"

namespace kvc::cachesvc {

namespace pb = ::kvcache::v1;
constexpr char kService[] = "AdminService";

grpc::Status AdminServiceImpl::ListPools(grpc::ServerContext*, const pb::ListPoolsRequest*,
                                         pb::ListPoolsResponse* response) {
  RpcScope scope(metrics_, kService, "ListPools");
  for (const PoolSnapshot& pool : store_->ListPools()) ToProto(pool, response->add_pools());
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::GetPoolStats(grpc::ServerContext*,
                                            const pb::GetPoolStatsRequest* request,
                                            pb::PoolStats* response) {
  RpcScope scope(metrics_, kService, "GetPoolStats");
  auto stats = store_->GetPoolStats(request->pool());
  if (!stats.ok()) return scope.Finish(ToGrpcStatus(stats.status()));
  ToProto(*stats, response);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::ListSequences(grpc::ServerContext*,
                                             const pb::ListSequencesRequest* request,
                                             pb::ListSequencesResponse* response) {
  RpcScope scope(metrics_, kService, "ListSequences");
  ListSequencesParams params;
  params.pool = request->pool();
  params.tenant = request->tenant();
  params.limit = request->limit();
  auto list = store_->ListSequences(params);
  if (!list.ok()) return scope.Finish(ToGrpcStatus(list.status()));
  for (const SequenceSnapshot& s : list->sequences) ToProto(s, response->add_sequences());
  response->set_total(list->total);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::EvictSequence(grpc::ServerContext*,
                                             const pb::EvictSequenceRequest* request,
                                             pb::EvictSequenceResponse* response) {
  RpcScope scope(metrics_, kService, "EvictSequence");
  auto evicted = store_->Evict(request->sequence_id());
  if (!evicted.ok()) return scope.Finish(ToGrpcStatus(evicted.status()));
  response->set_freed_blocks(evicted->freed_blocks);
  response->set_freed_bytes(evicted->freed_bytes);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status AdminServiceImpl::Drain(grpc::ServerContext*, const pb::DrainRequest* request,
                                     pb::DrainResponse* response) {
  RpcScope scope(metrics_, kService, "Drain");
  set_draining_(!request->resume());
  response->set_draining(store_->draining());
  auto stats = store_->GetPoolStats("");
  if (stats.ok()) response->set_sequences(stats->sequences);
  return scope.Finish(grpc::Status::OK);
}

}  // namespace kvc::cachesvc
