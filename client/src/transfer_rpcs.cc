#include "client/src/transfer_rpcs.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/src/client_impl.h"
#include "client/src/convert.h"
#include "client/src/local_reader.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "proto/rpc_status.h"

namespace kvc::client::internal {

namespace pb = ::kvcache::v1;

absl::StatusOr<NcclTransfer> OpenNcclTransfer(KvCacheClient& client, const std::string& pool,
                                              const CallOptions& call) {
  pb::OpenTransferRequest request;
  request.set_kind(pb::TRANSFER_KIND_NCCL);
  request.set_pool(pool);
  pb::OpenTransferResponse response;
  const absl::Status status =
      client.state().Call(&StubKv::OpenTransfer, request, &response, call, Retried::kNo);
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

absl::Status SendLease(KvCacheClient& client, const std::string& transfer_id,
                       const std::string& lease_id, uint64_t nonce, const CallOptions& call) {
  pb::SendLeaseRequest request;
  request.set_transfer_id(transfer_id);
  request.set_lease_id(lease_id);
  request.set_nonce(nonce);
  pb::SendLeaseResponse response;
  return client.state().Call(&StubKv::SendLease, request, &response, call, Retried::kNo);
}

absl::Status CloseTransfer(KvCacheClient& client, const std::string& transfer_id,
                           const CallOptions& call) {
  pb::CloseTransferRequest request;
  request.set_transfer_id(transfer_id);
  pb::CloseTransferResponse response;
  return client.state().Call(&StubKv::CloseTransfer, request, &response, call, Retried::kNo);
}

absl::StatusOr<AppendResult> AppendOverTransfer(KvCacheClient& client, const AppendChunk& chunk,
                                                const std::string& transfer_id, uint64_t nonce,
                                                const CallOptions& call) {
  AppendChunk header_only = chunk;
  header_only.keys = nullptr;
  header_only.values = nullptr;
  pb::AppendRequest request;
  ToProto(header_only, &request);
  request.mutable_nccl()->set_transfer_id(transfer_id);
  request.mutable_nccl()->set_nonce(nonce);
  request.mutable_nccl()->set_bytes(static_cast<int64_t>(chunk.bytes));
  pb::AppendResponse response;
  // Not retried: the bytes went over the transfer once.
  const absl::Status status =
      client.state().Call(&StubKv::Append, request, &response, call, Retried::kNo);
  if (!status.ok()) return status;
  return AppendResult{response.layer_tokens(), response.visible_tokens()};
}

absl::StatusOr<DeviceArenaHandle> ShareDeviceArena(KvCacheClient& client, const std::string& pool,
                                                   StorageFormat format, const CallOptions& call) {
  const std::shared_ptr<LocalReader> local = LocalPath(client, client.state(), call);
  if (local == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no same-node path to the server: ", client.DataPath()));
  }
  absl::StatusOr<DeviceArenaHandle> handle = local->DeviceArena(pool, format);
  if (!handle.ok() && absl::StrContains(handle.status().message(), " not found; this server has")) {
    return absl::NotFoundError(handle.status().message());
  }
  return handle;
}

}  // namespace kvc::client::internal
