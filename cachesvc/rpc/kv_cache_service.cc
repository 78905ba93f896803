#include "cachesvc/rpc/kv_cache_service.h"

#include "absl/strings/str_cat.h"
#include "cachesvc/rpc/proto_convert.h"
#include "proto/rpc_status.h"

namespace kvc::cachesvc {

namespace pb = ::kvcache::v1;

grpc::Status KvCacheServiceImpl::CreateSequence(grpc::ServerContext*,
                                                const pb::CreateSequenceRequest* request,
                                                pb::SequenceInfo* response) {
  CreateSequenceParams params;
  params.pool = request->pool();
  params.tenant = request->tenant();
  params.client_sequence_id = request->client_sequence_id();
  auto policy = FromProto(request->policy());
  if (!policy.ok()) return ToGrpcStatus(policy.status());
  params.policy = *policy;
  auto created = store_->CreateSequence(params);
  if (!created.ok()) return ToGrpcStatus(created.status());
  ToProto(*created, response);
  return grpc::Status::OK;
}

grpc::Status KvCacheServiceImpl::Append(grpc::ServerContext*, const pb::AppendRequest* request,
                                        pb::AppendResponse* response) {
  auto params = FromProto(*request);
  if (!params.ok()) return ToGrpcStatus(params.status());
  auto result = store_->Append(*params);
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->set_layer_tokens(result->layer_tokens);
  response->set_visible_tokens(result->visible_tokens);
  return grpc::Status::OK;
}

grpc::Status KvCacheServiceImpl::AppendStream(grpc::ServerContext*,
                                              grpc::ServerReader<pb::AppendRequest>* reader,
                                              pb::AppendStreamResponse* response) {
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
        continue;
      }
      status = result.status();
    } else {
      status = params.status();
    }
    // Earlier messages stay applied; say exactly how far the stream got.
    return ToGrpcStatus(absl::Status(
        status.code(), absl::StrCat("AppendStream message ", messages, " (layer ", request.layer(),
                                    ", start_position ", request.start_position(),
                                    ") rejected: ", status.message(), "; the ", messages,
                                    " earlier messages were applied")));
  }
  response->set_messages(messages);
  response->set_tokens(tokens);
  response->set_visible_tokens(visible);
  return grpc::Status::OK;
}

grpc::Status KvCacheServiceImpl::Fetch(grpc::ServerContext* context,
                                       const pb::FetchRequest* request,
                                       grpc::ServerWriter<pb::FetchChunk>* writer) {
  auto params = FromProto(*request);
  if (!params.ok()) return ToGrpcStatus(params.status());
  pb::FetchChunk message;
  const absl::Status status = store_->Fetch(*params, [&](FetchChunk& chunk) {
    if (context->IsCancelled()) return false;
    message.Clear();
    ToProto(chunk, &message);
    return writer->Write(message);
  });
  return ToGrpcStatus(status);
}

grpc::Status KvCacheServiceImpl::GetSequence(grpc::ServerContext*,
                                             const pb::GetSequenceRequest* request,
                                             pb::SequenceInfo* response) {
  auto snapshot = store_->GetSequence(request->sequence_id());
  if (!snapshot.ok()) return ToGrpcStatus(snapshot.status());
  ToProto(*snapshot, response);
  return grpc::Status::OK;
}

grpc::Status KvCacheServiceImpl::Release(grpc::ServerContext*, const pb::ReleaseRequest* request,
                                         pb::ReleaseResponse* response) {
  auto released = store_->Release(request->sequence_id());
  if (!released.ok()) return ToGrpcStatus(released.status());
  response->set_freed_blocks(released->freed_blocks);
  response->set_freed_bytes(released->freed_bytes);
  return grpc::Status::OK;
}

}  // namespace kvc::cachesvc
