#include "cachesvc/rpc/kv_cache_service.h"

#include "absl/strings/str_cat.h"
#include "cachesvc/rpc/proto_convert.h"
#include "cachesvc/rpc/rpc_scope.h"
#include "common/status_macros.h"
#include "proto/rpc_status.h"

namespace kvc::cachesvc {

namespace pb = ::kvcache::v1;
constexpr char kService[] = "KvCacheService";

grpc::Status KvCacheServiceImpl::CreateSequence(grpc::ServerContext*,
                                                const pb::CreateSequenceRequest* request,
                                                pb::SequenceInfo* response) {
  RpcScope scope(metrics_, kService, "CreateSequence");
  CreateSequenceParams params;
  params.pool = request->pool();
  params.tenant = request->tenant();
  params.client_sequence_id = request->client_sequence_id();
  auto policy = FromProto(request->policy());
  if (!policy.ok()) return scope.Finish(ToGrpcStatus(policy.status()));
  params.policy = *policy;
  auto created = store_->CreateSequence(params);
  if (!created.ok()) return scope.Finish(ToGrpcStatus(created.status()));
  ToProto(*created, response);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::Append(grpc::ServerContext*, const pb::AppendRequest* request,
                                        pb::AppendResponse* response) {
  RpcScope scope(metrics_, kService, "Append");
  auto params = FromProto(*request);
  if (!params.ok()) return scope.Finish(ToGrpcStatus(params.status()));
  auto result = store_->Append(*params);
  if (!result.ok()) return scope.Finish(ToGrpcStatus(result.status()));
  scope.AddReceived(static_cast<int64_t>(request->keys().size() + request->values().size()));
  response->set_layer_tokens(result->layer_tokens);
  response->set_visible_tokens(result->visible_tokens);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::AppendStream(grpc::ServerContext*,
                                              grpc::ServerReader<pb::AppendRequest>* reader,
                                              pb::AppendStreamResponse* response) {
  RpcScope scope(metrics_, kService, "AppendStream");
  pb::AppendRequest request;
  int64_t messages = 0;
  int64_t tokens = 0;
  int64_t visible = 0;
  while (reader->Read(&request)) {
    absl::Status status;
    auto params = FromProto(request);
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
  RpcScope scope(metrics_, kService, "Fetch");
  auto params = FromProto(*request);
  if (!params.ok()) return scope.Finish(ToGrpcStatus(params.status()));
  pb::FetchChunk message;
  const absl::Status status = store_->Fetch(*params, [&](FetchChunk& chunk) {
    if (context->IsCancelled()) return false;
    scope.AddSent(static_cast<int64_t>(chunk.keys.size() + chunk.values.size()));
    message.Clear();
    ToProto(chunk, &message);
    return writer->Write(message);
  });
  return scope.Finish(ToGrpcStatus(status));
}

grpc::Status KvCacheServiceImpl::GetSequence(grpc::ServerContext*,
                                             const pb::GetSequenceRequest* request,
                                             pb::SequenceInfo* response) {
  RpcScope scope(metrics_, kService, "GetSequence");
  auto snapshot = store_->GetSequence(request->sequence_id());
  if (!snapshot.ok()) return scope.Finish(ToGrpcStatus(snapshot.status()));
  ToProto(*snapshot, response);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::Release(grpc::ServerContext*, const pb::ReleaseRequest* request,
                                         pb::ReleaseResponse* response) {
  RpcScope scope(metrics_, kService, "Release");
  auto released = store_->Release(request->sequence_id());
  if (!released.ok()) return scope.Finish(ToGrpcStatus(released.status()));
  response->set_freed_blocks(released->freed_blocks);
  response->set_freed_bytes(released->freed_bytes);
  return scope.Finish(grpc::Status::OK);
}

grpc::Status KvCacheServiceImpl::Compress(grpc::ServerContext*, const pb::CompressRequest* request,
                                          pb::CompressResponse* response) {
  RpcScope scope(metrics_, kService, "Compress");
  auto params = FromProto(*request);
  if (!params.ok()) return scope.Finish(ToGrpcStatus(params.status()));
  for (const auto& q : request->queries())
    scope.AddReceived(static_cast<int64_t>(q.queries().size()));
  auto result = store_->Compress(*params);
  if (!result.ok()) return scope.Finish(ToGrpcStatus(result.status()));
  ToProto(*result, response);
  auto snapshot = store_->GetSequence(request->sequence_id());
  if (snapshot.ok()) ToProto(*snapshot, response->mutable_sequence());
  return scope.Finish(grpc::Status::OK);
}

absl::Status KvCacheServiceImpl::AttendOne(const pb::AttendRequest& request,
                                           pb::AttendResponse* response) {
  KVC_ASSIGN_OR_RETURN(AttendParams params, FromProto(request));
  KVC_ASSIGN_OR_RETURN(AttendResult result, store_->Attend(params));
  ToProto(result, request.layer(), response);
  return absl::OkStatus();
}

grpc::Status KvCacheServiceImpl::Attend(grpc::ServerContext*, const pb::AttendRequest* request,
                                        pb::AttendResponse* response) {
  RpcScope scope(metrics_, kService, "Attend");
  scope.AddReceived(static_cast<int64_t>(request->queries().size()));
  const absl::Status status = AttendOne(*request, response);
  scope.AddSent(static_cast<int64_t>(response->output().size()));
  return scope.Finish(ToGrpcStatus(status));
}

grpc::Status KvCacheServiceImpl::AttendStream(
    grpc::ServerContext*, grpc::ServerReaderWriter<pb::AttendResponse, pb::AttendRequest>* stream) {
  RpcScope scope(metrics_, kService, "AttendStream");
  pb::AttendRequest request;
  pb::AttendResponse response;
  int64_t answered = 0;
  while (stream->Read(&request)) {
    response.Clear();
    scope.AddReceived(static_cast<int64_t>(request.queries().size()));
    const absl::Status status = AttendOne(request, &response);
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

}  // namespace kvc::cachesvc
