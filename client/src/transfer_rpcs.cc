// KvCacheClient's transfer calls for readers outside the client (an NCCL reader): OpenTransfer
// of kind NCCL, SendLease, CloseTransfer. The TCP reader inside the client makes the same
// calls itself (data_paths.cc).
#include <grpcpp/grpcpp.h>

#include <string>

#include "client/src/client_impl.h"
#include "kvc/client/kv_cache_client.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "proto/rpc_status.h"

namespace kvc::client {

namespace pb = ::kvcache::v1;

absl::StatusOr<NcclTransfer> KvCacheClient::OpenNcclTransfer(const std::string& pool,
                                                             const CallOptions& call) {
  pb::OpenTransferRequest request;
  request.set_kind(pb::TRANSFER_KIND_NCCL);
  request.set_pool(pool);
  pb::OpenTransferResponse response;
  grpc::ClientContext context;
  impl_->Prepare(&context, call);
  const absl::Status status = FromGrpcStatus(impl_->kv->OpenTransfer(&context, request, &response));
  if (!status.ok()) return status;
  if (response.kind() != pb::TRANSFER_KIND_NCCL) {
    return absl::FailedPreconditionError(
        "the server answered OpenTransfer kind NCCL with another kind (an older kvcached?)");
  }
  NcclTransfer t;
  t.transfer_id = response.transfer_id();
  t.unique_id = response.nccl_unique_id();
  t.connect_within_ms = response.connect_within_ms();
  t.nccl_version = response.nccl_version();
  return t;
}

absl::Status KvCacheClient::SendLease(const std::string& transfer_id, const std::string& lease_id,
                                      uint64_t nonce, const CallOptions& call) {
  pb::SendLeaseRequest request;
  request.set_transfer_id(transfer_id);
  request.set_lease_id(lease_id);
  request.set_nonce(nonce);
  pb::SendLeaseResponse response;
  grpc::ClientContext context;
  impl_->Prepare(&context, call);
  return FromGrpcStatus(impl_->kv->SendLease(&context, request, &response));
}

absl::Status KvCacheClient::CloseTransfer(const std::string& transfer_id, const CallOptions& call) {
  pb::CloseTransferRequest request;
  request.set_transfer_id(transfer_id);
  pb::CloseTransferResponse response;
  grpc::ClientContext context;
  impl_->Prepare(&context, call);
  return FromGrpcStatus(impl_->kv->CloseTransfer(&context, request, &response));
}

}  // namespace kvc::client
