#include "cachesvc/rpc/kv_cache_service.h"

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "cachesvc/rpc/handler_macros.h"
#include "cachesvc/rpc/proto_convert.h"
#include "cachesvc/rpc/rpc_scope.h"
#include "common/status_macros.h"
#include "proto/rpc_status.h"

namespace kvc::cachesvc {

namespace pb = ::kvcache::v1;
constexpr char kCacheService[] = "KvCacheService";

grpc::Status KvCacheServiceImpl::CreateSequence(grpc::ServerContext* context,
                                                const pb::CreateSequenceRequest* request,
                                                pb::SequenceInfo* response) {
  RpcScope scope(metrics_, kCacheService, "CreateSequence");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  CreateSequenceParams params;
  if (caller.authenticated) {
    // The tenant is the credential's; a request naming another one is a mistake to report.
    if (!request->tenant().empty() && request->tenant() != caller.tenant) {
      return scope.Finish(ToGrpcStatus(absl::PermissionDeniedError(
          absl::StrCat("the request's tenant ", Quoted(request->tenant()),
                       " is not the caller's ('", caller.tenant, "'); leave tenant empty"))));
    }
    params.scope = OwnScope(caller);
    params.tenant = caller.tenant;
  } else {
    params.tenant = request->tenant();
  }
  params.pool = request->pool();
  params.client_sequence_id = request->client_sequence_id();
  KVC_ASSIGN_OR_FINISH(params.policy, FromProto(request->policy()));
  if (request->has_prefix()) params.prefix = FromProto(request->prefix());
  KVC_ASSIGN_OR_FINISH(const SequenceSnapshot created, store_->CreateSequence(params));
  ToProto(created, response);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::ForkSequence(grpc::ServerContext* context,
                                              const pb::ForkSequenceRequest* request,
                                              pb::SequenceInfo* response) {
  RpcScope scope(metrics_, kCacheService, "ForkSequence");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  ForkSequenceParams params;
  KVC_ASSIGN_OR_FINISH(params.scope, access_->ScopeFor(caller, "", "ForkSequence"));
  params.sequence_id = request->sequence_id();
  params.client_sequence_id = request->client_sequence_id();
  KVC_ASSIGN_OR_FINISH(const SequenceSnapshot forked, store_->ForkSequence(params));
  ToProto(forked, response);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::LeaseSequence(grpc::ServerContext* context,
                                               const pb::LeaseRequest* request,
                                               pb::Lease* response) {
  RpcScope scope(metrics_, kCacheService, "LeaseSequence");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  LeaseParams params = FromProto(*request);
  KVC_ASSIGN_OR_FINISH(params.scope, access_->ScopeFor(caller, "", "LeaseSequence"));
  KVC_ASSIGN_OR_FINISH(const LeaseSnapshot lease, store_->leases().LeaseSequence(params));
  ToProto(lease, response);
  response->set_local_token(endpoints_->local_token);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::RenewLease(grpc::ServerContext* context,
                                            const pb::RenewLeaseRequest* request,
                                            pb::RenewLeaseResponse* response) {
  RpcScope scope(metrics_, kCacheService, "RenewLease");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const TenantScope lease_scope, access_->ScopeFor(caller, "", "RenewLease"));
  KVC_ASSIGN_OR_FINISH(
      const int64_t expires,
      store_->leases().RenewLease(lease_scope, request->lease_id(), request->ttl_ms()));
  response->set_expires_unix_ms(expires);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::ReleaseLease(grpc::ServerContext* context,
                                              const pb::ReleaseLeaseRequest* request,
                                              pb::ReleaseLeaseResponse* response) {
  RpcScope scope(metrics_, kCacheService, "ReleaseLease");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const TenantScope lease_scope,
                       access_->ScopeFor(caller, "", "ReleaseLease"));
  KVC_ASSIGN_OR_FINISH(const int64_t freed,
                       store_->leases().ReleaseLease(lease_scope, request->lease_id()));
  response->set_freed_blocks(freed);
  return scope.Finish(grpc::Status::OK);
}

namespace {

absl::Status NoNcclTransfers() {
  return absl::FailedPreconditionError(
      "this server offers no NCCL transfers (ServerConfig.transfer_nccl_library is unset)");
}

}  // namespace

grpc::Status KvCacheServiceImpl::OpenTransfer(grpc::ServerContext* context,
                                              const pb::OpenTransferRequest* request,
                                              pb::OpenTransferResponse* response) {
  RpcScope scope(metrics_, kCacheService, "OpenTransfer");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const TenantScope owner, access_->ScopeFor(caller, "", "OpenTransfer"));
  KVC_ASSIGN_OR_FINISH(const OpenedTransfer opened,
                       transfers_->Open(request->kind(), owner, request->pool()));
  response->set_transfer_id(opened.id);
  response->set_kind(request->kind() == pb::TRANSFER_KIND_NCCL ? pb::TRANSFER_KIND_NCCL
                                                               : pb::TRANSFER_KIND_TCP);
  response->set_connect_within_ms(opened.connect_within_ms);
  response->set_host(opened.host);
  response->set_port(opened.port);
  response->set_token(opened.token);
  response->set_frame_key(opened.frame_key);
  response->set_tls(opened.tls);
  response->set_nccl_unique_id(opened.nccl_unique_id);
  response->set_nccl_version(opened.nccl_version);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::SendLease(grpc::ServerContext* context,
                                           const pb::SendLeaseRequest* request,
                                           pb::SendLeaseResponse* response) {
  RpcScope scope(metrics_, kCacheService, "SendLease");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const TenantScope owner, access_->ScopeFor(caller, "", "SendLease"));
  KVC_ASSIGN_OR_FINISH(const SentBlocks sent,
                       transfers_->Send(owner, request->transfer_id(), request->lease_id(),
                                        request->nonce(), absl::FromChrono(context->deadline())));
  response->set_blocks(sent.blocks);
  response->set_bytes(sent.bytes);
  if (metrics_ != nullptr) metrics_->RecordTransferBytes(sent.bytes);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::CloseTransfer(grpc::ServerContext* context,
                                               const pb::CloseTransferRequest* request,
                                               pb::CloseTransferResponse* /*response*/) {
  RpcScope scope(metrics_, kCacheService, "CloseTransfer");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const TenantScope owner, access_->ScopeFor(caller, "", "CloseTransfer"));
  KVC_FINISH_IF_ERROR(transfers_->Close(owner, request->transfer_id()));
  return scope.Finish(grpc::Status::OK);
}

absl::StatusOr<AppendParams> KvCacheServiceImpl::AppendFromProto(
    const pb::AppendRequest& request, const TenantScope& scope,
    std::shared_ptr<const StagingRegion>* hold) const {
  if (request.has_nccl()) {
    return absl::InvalidArgumentError(
        "an AppendStream message cannot take its keys and values over NCCL (nccl set): "
        "send those with Append, one at a time per transfer");
  }
  KVC_ASSIGN_OR_RETURN(AppendParams params, FromProto(request));
  params.scope = scope;
  if (!request.has_staged()) return params;
  if (!request.keys().empty() || !request.values().empty()) {
    return absl::InvalidArgumentError(
        "an Append carries its keys and values either in keys/values or in staged, not both");
  }
  if (staging_ == nullptr) {
    return absl::FailedPreconditionError(
        "this server has no local_socket, so no staging regions: send keys and values in the "
        "request");
  }
  const pb::StagedKv& staged = request.staged();
  KVC_ASSIGN_OR_RETURN(*hold, staging_->Find(scope, staged.region_id()));
  const int64_t size = (*hold)->bytes();
  const int64_t n = staged.bytes();
  for (const int64_t offset : {staged.keys_offset(), staged.values_offset()}) {
    // Written so that nothing overflows: every term is in [0, size].
    if (n < 0 || offset < 0 || n > size || offset > size - n) {
      return absl::OutOfRangeError(absl::StrCat("staged bytes [", offset, ", +", n,
                                                ") do not lie in the ", size,
                                                "-byte staging region"));
    }
  }
  const char* base = reinterpret_cast<const char*>((*hold)->data());
  params.keys = absl::string_view(base + staged.keys_offset(), static_cast<size_t>(n));
  params.values = absl::string_view(base + staged.values_offset(), static_cast<size_t>(n));
  return params;
}

absl::StatusOr<AppendResult> KvCacheServiceImpl::AppendOverNccl(const pb::AppendRequest& request,
                                                                const TenantScope& scope,
                                                                absl::Time deadline) {
  if (nccl_ == nullptr) return NoNcclTransfers();
  const pb::NcclKv& nccl = request.nccl();
  absl::StatusOr<AppendResult> result;
  KVC_RETURN_IF_ERROR(nccl_->Receive(
      scope, nccl.transfer_id(), nccl.nonce(), nccl.bytes(), deadline,
      [&](const char* keys, const char* values, const std::string& device) {
        // Received: a refusal from here on leaves the transfer in step.
        if (!request.keys().empty() || !request.values().empty() || request.has_staged()) {
          return absl::InvalidArgumentError(
              "an Append carries its keys and values in one of keys/values, staged or nccl");
        }
        absl::StatusOr<AppendParams> params = FromProto(request);
        if (!params.ok()) return params.status();
        params->scope = scope;
        params->keys = absl::string_view(keys, static_cast<size_t>(nccl.bytes()));
        params->values = absl::string_view(values, static_cast<size_t>(nccl.bytes()));
        params->on_device = true;
        params->device = device;
        result = store_->Append(*params);
        return result.status();
      }));
  return result;
}

grpc::Status KvCacheServiceImpl::Append(grpc::ServerContext* context,
                                        const pb::AppendRequest* request,
                                        pb::AppendResponse* response) {
  RpcScope scope(metrics_, kCacheService, "Append");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  if (request->has_nccl()) {
    KVC_ASSIGN_OR_FINISH(const TenantScope owner, access_->ScopeFor(caller, "", "Append"));
    KVC_ASSIGN_OR_FINISH(const AppendResult result,
                         AppendOverNccl(*request, owner, absl::FromChrono(context->deadline())));
    scope.AddReceived(2 * request->nccl().bytes());
    response->set_layer_tokens(result.layer_tokens);
    response->set_visible_tokens(result.visible_tokens);
    return scope.Finish(grpc::Status::OK);
  }
  std::shared_ptr<const StagingRegion> staged;
  KVC_ASSIGN_OR_FINISH(const TenantScope tenant_scope, access_->ScopeFor(caller, "", "Append"));
  KVC_ASSIGN_OR_FINISH(AppendParams params, AppendFromProto(*request, tenant_scope, &staged));
  KVC_ASSIGN_OR_FINISH(const AppendResult result, store_->Append(params));
  scope.AddReceived(static_cast<int64_t>(request->keys().size() + request->values().size()));
  response->set_layer_tokens(result.layer_tokens);
  response->set_visible_tokens(result.visible_tokens);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::AppendStream(grpc::ServerContext* context,
                                              grpc::ServerReader<pb::AppendRequest>* reader,
                                              pb::AppendStreamResponse* response) {
  RpcScope scope(metrics_, kCacheService, "AppendStream");
  CredentialCheck credential(access_);
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const CallLimits::Slot slot, access_->Enter(caller, CallKind::kStream));
  KVC_ASSIGN_OR_FINISH(const TenantScope tenant_scope,
                       access_->ScopeFor(caller, "", "AppendStream"));
  pb::AppendRequest request;
  int64_t messages = 0;
  int64_t tokens = 0;
  int64_t visible = 0;
  while (reader->Read(&request)) {
    if (const absl::Status valid = credential.StillValid(*context, caller); !valid.ok()) {
      return scope.Finish(ToGrpcStatus(absl::Status(
          valid.code(), absl::StrCat(valid.message(), "; AppendStream applied ", messages,
                                     " messages, none after the revocation"))));
    }
    absl::Status status;
    std::shared_ptr<const StagingRegion> staged;
    auto params = AppendFromProto(request, tenant_scope, &staged);
    if (params.ok()) {
      auto result = store_->Append(*params);
      if (result.ok()) {
        ++messages;
        tokens += params->num_tokens;
        visible = result->visible_tokens;
        scope.AddReceived(static_cast<int64_t>(request.keys().size() + request.values().size()));
        continue;
      }
      status = result.status();
    } else {
      status = params.status();
    }
    // Earlier messages stay applied; say exactly how far the stream got.
    return scope.Finish(ToGrpcStatus(absl::Status(
        status.code(), absl::StrCat("AppendStream message ", messages, " (layer ", request.layer(),
                                    ", start_position ", request.start_position(),
                                    ") rejected: ", status.message(), "; the ", messages,
                                    " earlier messages were applied"))));
  }
  response->set_messages(messages);
  response->set_tokens(tokens);
  response->set_visible_tokens(visible);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::Fetch(grpc::ServerContext* context,
                                       const pb::FetchRequest* request,
                                       grpc::ServerWriter<pb::FetchChunk>* writer) {
  RpcScope scope(metrics_, kCacheService, "Fetch");
  CredentialCheck credential(access_);
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const CallLimits::Slot slot, access_->Enter(caller, CallKind::kStream));
  KVC_ASSIGN_OR_FINISH(FetchParams params, FromProto(*request));
  KVC_ASSIGN_OR_FINISH(params.scope, access_->ScopeFor(caller, request->tenant(), "Fetch"));
  pb::FetchChunk message;
  absl::Status revoked;
  const absl::Status status = store_->Fetch(params, [&](FetchChunk& chunk) {
    if (context->IsCancelled()) return false;
    revoked = credential.StillValid(*context, caller);
    if (!revoked.ok()) return false;
    scope.AddSent(static_cast<int64_t>(chunk.keys.size() + chunk.values.size()));
    message.Clear();
    ToProto(chunk, &message);
    return writer->Write(message);
  });
  return scope.Finish(ToGrpcStatus(revoked.ok() ? status : revoked));
}

grpc::Status KvCacheServiceImpl::GetSequence(grpc::ServerContext* context,
                                             const pb::GetSequenceRequest* request,
                                             pb::SequenceInfo* response) {
  RpcScope scope(metrics_, kCacheService, "GetSequence");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const TenantScope tenant_scope,
                       access_->ScopeFor(caller, request->tenant(), "GetSequence"));
  KVC_ASSIGN_OR_FINISH(const SequenceSnapshot snapshot,
                       store_->GetSequence(request->sequence_id(), tenant_scope));
  ToProto(snapshot, response);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::Release(grpc::ServerContext* context,
                                         const pb::ReleaseRequest* request,
                                         pb::ReleaseResponse* response) {
  RpcScope scope(metrics_, kCacheService, "Release");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const TenantScope tenant_scope, access_->ScopeFor(caller, "", "Release"));
  KVC_ASSIGN_OR_FINISH(const ReleaseResult released,
                       store_->Release(request->sequence_id(), tenant_scope));
  response->set_freed_blocks(released.freed_blocks);
  response->set_freed_bytes(released.freed_bytes);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::Compress(grpc::ServerContext* context,
                                          const pb::CompressRequest* request,
                                          pb::CompressResponse* response) {
  RpcScope scope(metrics_, kCacheService, "Compress");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const CallLimits::Slot slot, access_->Enter(caller, CallKind::kCompute));
  KVC_ASSIGN_OR_FINISH(CompressParams params, FromProto(*request));
  KVC_ASSIGN_OR_FINISH(params.scope, access_->ScopeFor(caller, "", "Compress"));
  for (const auto& q : request->queries())
    scope.AddReceived(static_cast<int64_t>(q.queries().size()));
  for (const auto& q : request->query_stats()) {
    scope.AddReceived(static_cast<int64_t>(sizeof(float)) * (q.mean_size() + q.covariance_size()));
  }
  KVC_ASSIGN_OR_FINISH(const CompressResult result, store_->Compress(params));
  ToProto(result, response);
  auto snapshot = store_->GetSequence(request->sequence_id(), params.scope);
  if (snapshot.ok()) ToProto(*snapshot, response->mutable_sequence());
  return scope.Finish(grpc::Status::OK);
}

absl::Status KvCacheServiceImpl::AttendOne(const TenantScope& tenant_scope,
                                           const pb::AttendRequest& request,
                                           pb::AttendResponse* response) {
  KVC_ASSIGN_OR_RETURN(AttendParams params, FromProto(request));
  params.scope = tenant_scope;
  KVC_ASSIGN_OR_RETURN(AttendResult result, store_->Attend(params));
  ToProto(result, request.layer(), response);
  return absl::OkStatus();
}

grpc::Status KvCacheServiceImpl::Attend(grpc::ServerContext* context,
                                        const pb::AttendRequest* request,
                                        pb::AttendResponse* response) {
  RpcScope scope(metrics_, kCacheService, "Attend");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const CallLimits::Slot slot, access_->Enter(caller, CallKind::kCompute));
  KVC_ASSIGN_OR_FINISH(const TenantScope tenant_scope, access_->ScopeFor(caller, "", "Attend"));
  scope.AddReceived(static_cast<int64_t>(request->queries().size()));
  const absl::Status status = AttendOne(tenant_scope, *request, response);
  scope.AddSent(static_cast<int64_t>(response->output().size()));
  return scope.Finish(ToGrpcStatus(status));
}

grpc::Status KvCacheServiceImpl::AttendStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<pb::AttendResponse, pb::AttendRequest>* stream) {
  RpcScope scope(metrics_, kCacheService, "AttendStream");
  CredentialCheck credential(access_);
  KVC_AUTHENTICATE_OR_FINISH(caller);
  KVC_ASSIGN_OR_FINISH(const CallLimits::Slot slot, access_->Enter(caller, CallKind::kStream));
  KVC_ASSIGN_OR_FINISH(const TenantScope tenant_scope,
                       access_->ScopeFor(caller, "", "AttendStream"));
  pb::AttendRequest request;
  pb::AttendResponse response;
  int64_t answered = 0;
  while (stream->Read(&request)) {
    if (const absl::Status valid = credential.StillValid(*context, caller); !valid.ok()) {
      return scope.Finish(ToGrpcStatus(valid));
    }
    response.Clear();
    scope.AddReceived(static_cast<int64_t>(request.queries().size()));
    const absl::Status status = AttendOne(tenant_scope, request, &response);
    if (!status.ok()) {
      return scope.Finish(ToGrpcStatus(absl::Status(
          status.code(), absl::StrCat("AttendStream request ", answered, " (layer ",
                                      request.layer(), ") rejected: ", status.message()))));
    }
    scope.AddSent(static_cast<int64_t>(response.output().size()));
    if (!stream->Write(response)) break;
    ++answered;
  }
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::LookupPrefix(grpc::ServerContext* context,
                                              const pb::LookupPrefixRequest* request,
                                              pb::LookupPrefixResponse* response) {
  RpcScope scope(metrics_, kCacheService, "LookupPrefix");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  LookupPrefixParams params;
  KVC_ASSIGN_OR_FINISH(params.scope, access_->ScopeFor(caller, "", "LookupPrefix"));
  params.pool = request->pool();
  params.prefix = FromProto(request->prefix());
  if (request->storage() != pb::STORAGE_FORMAT_UNSPECIFIED) {
    KVC_ASSIGN_OR_FINISH(params.format, FromProto(request->storage(), "storage"));
  }
  KVC_ASSIGN_OR_FINISH(const LookupPrefixResult result, store_->prefixes().LookupPrefix(params));
  response->set_cached_tokens(result.cached_tokens);
  response->set_block_tokens(static_cast<int32_t>(result.block_tokens));
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::PublishPrefix(grpc::ServerContext* context,
                                               const pb::PublishPrefixRequest* request,
                                               pb::PublishPrefixResponse* response) {
  RpcScope scope(metrics_, kCacheService, "PublishPrefix");
  KVC_AUTHENTICATE_OR_FINISH(caller);
  PublishPrefixParams params;
  KVC_ASSIGN_OR_FINISH(params.scope, access_->ScopeFor(caller, "", "PublishPrefix"));
  params.sequence_id = request->sequence_id();
  params.prefix = FromProto(request->prefix());
  KVC_ASSIGN_OR_FINISH(const PublishPrefixResult result, store_->prefixes().PublishPrefix(params));
  response->set_published_tokens(result.published_tokens);
  response->set_new_tokens(result.new_tokens);
  return scope.Finish(grpc::Status::OK);
}

}  // namespace kvc::cachesvc
