// KvCacheClient's transfer calls for peers outside the client (kvc::client::NcclLink):
// OpenTransfer of kind NCCL, SendLease, CloseTransfer, Append over a transfer. The TCP
// reader inside the client makes the same calls itself (data_paths.cc).
#include <grpcpp/grpcpp.h>

#include <string>

#include "client/src/client_impl.h"
#include "client/src/convert.h"
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
  const absl::Status status =
      impl_->Call(&StubKv::OpenTransfer, request, &response, call, Retried::kNo);
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
  return impl_->Call(&StubKv::SendLease, request, &response, call, Retried::kNo);
}

absl::Status KvCacheClient::CloseTransfer(const std::string& transfer_id, const CallOptions& call) {
  pb::CloseTransferRequest request;
  request.set_transfer_id(transfer_id);
  pb::CloseTransferResponse response;
  return impl_->Call(&StubKv::CloseTransfer, request, &response, call, Retried::kNo);
}

absl::StatusOr<AppendResult> KvCacheClient::AppendOverTransfer(const AppendChunk& chunk,
                                                               const std::string& transfer_id,
                                                               uint64_t nonce,
                                                               const CallOptions& call) {
  AppendChunk header_only = chunk;
  header_only.keys = nullptr;
  header_only.values = nullptr;
  pb::AppendRequest request;
  internal::ToProto(header_only, &request);
  request.mutable_nccl()->set_transfer_id(transfer_id);
  request.mutable_nccl()->set_nonce(nonce);
  request.mutable_nccl()->set_bytes(static_cast<int64_t>(chunk.bytes));
  pb::AppendResponse response;
  // Not retried: the bytes went over the transfer once.
  const absl::Status status = impl_->Call(&StubKv::Append, request, &response, call, Retried::kNo);
  if (!status.ok()) return status;
  return AppendResult{response.layer_tokens(), response.visible_tokens()};
}

}  // namespace kvc::client
