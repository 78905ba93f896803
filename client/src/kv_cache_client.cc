#include "kvc/client/kv_cache_client.h"

#include <grpcpp/grpcpp.h>

#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/channel/channel.h"
#include "client/src/append_streams.h"
#include "client/src/client_impl.h"
#include "client/src/convert.h"
#include "client/src/local_reader.h"
#include "client/src/read_path.h"
#include "client/src/staging_space.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "proto/rpc_status.h"

namespace kvc::client {

namespace pb = ::kvcache::v1;
using internal::FromProto;
using internal::ToProto;

namespace internal {

absl::StatusOr<std::unique_ptr<KvCacheClient::Impl>> NewImpl(const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("target is empty");
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts is ", options.max_attempts, "; expected >= 1"));
  }
  if (options.default_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_deadline must be positive");
  }
  auto channel = CreateChannel(options);
  if (!channel.ok()) return channel.status();
  auto impl = std::make_unique<KvCacheClient::Impl>();
  impl->options = options;
  impl->channel = *std::move(channel);
  impl->kv = pb::KvCacheService::NewStub(impl->channel);
  impl->admin = pb::AdminService::NewStub(impl->channel);
  return impl;
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<KvCacheClient>> KvCacheClient::Connect(
    const ClientOptions& options) {
  auto impl = internal::NewImpl(options);
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<KvCacheClient>(new KvCacheClient(*std::move(impl)));
}

KvCacheClient::KvCacheClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->grpc_reads = internal::MakeGrpcReadPath(*this, *impl_);
}
KvCacheClient::~KvCacheClient() = default;

const ClientOptions& KvCacheClient::options() const { return impl_->options; }

absl::StatusOr<SequenceInfo> KvCacheClient::CreateSequence(const CreateSequenceOptions& options,
                                                           const CallOptions& call) {
  pb::CreateSequenceRequest request;
  request.set_pool(options.pool);
  request.set_tenant(options.tenant);
  request.set_client_sequence_id(options.client_sequence_id);
  ToProto(options.policy, request.mutable_policy());
  if (options.prefix) ToProto(*options.prefix, request.mutable_prefix());
  pb::SequenceInfo response;
  // Not retried: a lost reply would make a retry create a second sequence.
  const absl::Status status =
      impl_->Call(&StubKv::CreateSequence, request, &response, call, Retried::kNo);
  if (!status.ok()) return status;
  return FromProto(response);
}

absl::StatusOr<SequenceInfo> KvCacheClient::ForkSequence(const std::string& sequence_id,
                                                         const std::string& client_sequence_id,
                                                         const CallOptions& call) {
  pb::ForkSequenceRequest request;
  request.set_sequence_id(sequence_id);
  request.set_client_sequence_id(client_sequence_id);
  pb::SequenceInfo response;
  const absl::Status status =
      impl_->Call(&StubKv::ForkSequence, request, &response, call, Retried::kNo);
  if (!status.ok()) return status;
  return FromProto(response);
}

absl::StatusOr<Lease> KvCacheClient::LeaseSequence(const std::string& sequence_id,
                                                   const std::vector<int32_t>& layers,
                                                   absl::Duration ttl, const CallOptions& call) {
  pb::LeaseRequest request;
  request.set_sequence_id(sequence_id);
  request.mutable_layers()->Add(layers.begin(), layers.end());
  request.set_ttl_ms(absl::ToInt64Milliseconds(ttl));
  pb::Lease response;
  const absl::Status status =
      impl_->Call(&StubKv::LeaseSequence, request, &response, call, Retried::kNo);
  if (!status.ok()) return status;
  return FromProto(response);
}

absl::StatusOr<absl::Time> KvCacheClient::RenewLease(const std::string& lease_id,
                                                     absl::Duration ttl, const CallOptions& call) {
  pb::RenewLeaseRequest request;
  request.set_lease_id(lease_id);
  request.set_ttl_ms(absl::ToInt64Milliseconds(ttl));
  pb::RenewLeaseResponse response;
  const absl::Status status =
      impl_->Call(&StubKv::RenewLease, request, &response, call, Retried::kYes);
  if (!status.ok()) return status;
  return absl::FromUnixMillis(response.expires_unix_ms());
}

absl::StatusOr<int64_t> KvCacheClient::ReleaseLease(const std::string& lease_id,
                                                    const CallOptions& call) {
  pb::ReleaseLeaseRequest request;
  request.set_lease_id(lease_id);
  pb::ReleaseLeaseResponse response;
  const absl::Status status =
      impl_->Call(&StubKv::ReleaseLease, request, &response, call, Retried::kNo);
  if (!status.ok()) return status;
  return response.freed_blocks();
}

absl::StatusOr<AppendResult> KvCacheClient::Append(const AppendChunk& chunk,
                                                   const CallOptions& call) {
  pb::AppendRequest request;
  const std::shared_ptr<internal::StagingSpace> staging =
      chunk.bytes > 0 ? internal::LocalStaging(*this, *impl_, call) : nullptr;
  std::optional<internal::StagingSpace::Slot> slot =
      staging != nullptr ? internal::Stage(*staging, chunk, &request) : std::nullopt;
  if (!slot.has_value()) ToProto(chunk, &request);
  pb::AppendResponse response;
  // Not retried: a retry after a lost reply would be refused as out of order.
  const absl::Status status = impl_->Call(&StubKv::Append, request, &response, call, Retried::kNo);
  // Reusing those bytes while the server might still read them could mix two chunks into one
  // append: such a slot is never given out again.
  if (slot.has_value() && internal::ServerMayStillRead(status)) slot->Abandon();
  if (!status.ok()) return status;
  return AppendResult{response.layer_tokens(), response.visible_tokens()};
}

std::unique_ptr<AppendStream> KvCacheClient::StartAppendStream(const CallOptions& call) {
  if (std::shared_ptr<internal::StagingSpace> staging = internal::LocalStaging(*this, *impl_, call);
      staging != nullptr) {
    return internal::MakeStagedAppendStream(
        *impl_, std::move(staging),
        call.deadline > absl::ZeroDuration() ? call.deadline : impl_->options.default_deadline);
  }
  return internal::MakeGrpcAppendStream(*impl_, call);
}

absl::Status KvCacheClient::FetchChunks(const std::string& sequence_id, const FetchOptions& options,
                                        const std::function<absl::Status(FetchedChunk&)>& on_chunk,
                                        const CallOptions& call) {
  std::string path;
  return FetchChunksVia(sequence_id, options, on_chunk, call, &path);
}

absl::Status KvCacheClient::FetchChunksVia(
    const std::string& sequence_id, const FetchOptions& options,
    const std::function<absl::Status(FetchedChunk&)>& on_chunk, const CallOptions& call,
    std::string* path) {
  const std::shared_ptr<internal::ReadPath> reads = internal::ReadPathFor(*this, *impl_, call);
  std::string fall_back;
  absl::Status status = reads->ReadChunks(sequence_id, options, on_chunk, call, &fall_back);
  if (fall_back.empty()) {
    *path = reads == impl_->grpc_reads ? DataPath() : reads->name();
    return status;
  }
  *path = std::move(fall_back);
  return impl_->grpc_reads->ReadChunks(sequence_id, options, on_chunk, call, &fall_back);
}

absl::StatusOr<FetchResult> KvCacheClient::Fetch(const std::string& sequence_id,
                                                 const FetchOptions& options,
                                                 const CallOptions& call) {
  FetchResult result;
  std::vector<std::pair<int, int>> order;  // (layer, head) of result.heads
  const absl::Status status = FetchChunksVia(
      sequence_id, options,
      [&](FetchedChunk& chunk) -> absl::Status {
        result.visible_tokens = chunk.visible_tokens;
        result.dtype = chunk.dtype;
        if (result.heads.empty()) {
          result.storage = chunk.storage;
          result.record_bytes = chunk.record_bytes;
        }
        // Records of different formats (a raw residual) never share one byte string.
        const bool new_part = options.stored_format && !result.heads.empty() &&
                              result.heads.back().storage != chunk.storage;
        if (order.empty() || order.back() != std::make_pair(chunk.layer, chunk.kv_head) ||
            new_part) {
          order.emplace_back(chunk.layer, chunk.kv_head);
          FetchedHead head;
          head.layer = chunk.layer;
          head.kv_head = chunk.kv_head;
          head.first_index = chunk.first_index;
          head.storage = chunk.storage;
          head.record_bytes = chunk.record_bytes;
          result.heads.push_back(std::move(head));
        }
        FetchedHead& head = result.heads.back();
        if (chunk.first_index != head.first_index + static_cast<int64_t>(head.positions.size())) {
          return absl::InternalError(absl::StrCat("Fetch chunk for layer ", chunk.layer, " head ",
                                                  chunk.kv_head, " starts at ", chunk.first_index,
                                                  " but ", head.first_index + head.positions.size(),
                                                  " tokens arrived before it"));
        }
        head.positions.insert(head.positions.end(), chunk.positions.begin(), chunk.positions.end());
        if (head.keys.empty()) {
          head.keys = std::move(chunk.keys);
          head.values = std::move(chunk.values);
        } else {
          head.keys += chunk.keys;
          head.values += chunk.values;
        }
        return absl::OkStatus();
      },
      call, &result.path);
  if (!status.ok()) return status;
  return result;
}

absl::StatusOr<SequenceInfo> KvCacheClient::GetSequence(const std::string& sequence_id,
                                                        const CallOptions& call) {
  pb::GetSequenceRequest request;
  request.set_sequence_id(sequence_id);
  pb::SequenceInfo response;
  const absl::Status status =
      impl_->Call(&StubKv::GetSequence, request, &response, call, Retried::kYes);
  if (!status.ok()) return status;
  return FromProto(response);
}

absl::StatusOr<int64_t> KvCacheClient::LookupPrefix(const std::string& pool, const Prefix& prefix,
                                                    StorageFormat storage,
                                                    const CallOptions& call) {
  pb::LookupPrefixRequest request;
  request.set_pool(pool);
  ToProto(prefix, request.mutable_prefix());
  request.set_storage(static_cast<pb::StorageFormat>(storage));  // same numbering
  pb::LookupPrefixResponse response;
  const absl::Status status =
      impl_->Call(&StubKv::LookupPrefix, request, &response, call, Retried::kYes);
  if (!status.ok()) return status;
  return response.cached_tokens();
}

absl::StatusOr<PublishResult> KvCacheClient::PublishPrefix(const std::string& sequence_id,
                                                           const Prefix& prefix,
                                                           const CallOptions& call) {
  pb::PublishPrefixRequest request;
  request.set_sequence_id(sequence_id);
  ToProto(prefix, request.mutable_prefix());
  pb::PublishPrefixResponse response;
  // Retried: publishing what is already cached changes nothing.
  const absl::Status status =
      impl_->Call(&StubKv::PublishPrefix, request, &response, call, Retried::kYes);
  if (!status.ok()) return status;
  return PublishResult{response.published_tokens(), response.new_tokens()};
}

absl::StatusOr<ReleaseResult> KvCacheClient::Release(const std::string& sequence_id,
                                                     const CallOptions& call) {
  pb::ReleaseRequest request;
  request.set_sequence_id(sequence_id);
  pb::ReleaseResponse response;
  const absl::Status status = impl_->Call(&StubKv::Release, request, &response, call, Retried::kNo);
  if (!status.ok()) return status;
  return ReleaseResult{response.freed_blocks(), response.freed_bytes()};
}

namespace {

absl::StatusOr<CompressResult> SendCompress(const KvCacheClient::Impl& impl,
                                            const pb::CompressRequest& request,
                                            const CallOptions& call) {
  pb::CompressResponse response;
  // Not retried: a second Compress after a lost reply would evict again.
  const absl::Status status = impl.Call(&StubKv::Compress, request, &response, call, Retried::kNo);
  if (!status.ok()) return status;
  return FromProto(response);
}

}  // namespace

absl::StatusOr<CompressResult> KvCacheClient::Compress(const std::string& sequence_id,
                                                       const CompressionSpec& spec,
                                                       const std::vector<LayerQueries>& queries,
                                                       const CallOptions& call) {
  pb::CompressRequest request;
  request.set_sequence_id(sequence_id);
  ToProto(spec, request.mutable_spec());
  for (const LayerQueries& q : queries) {
    auto* out = request.add_queries();
    out->set_layer(q.layer);
    out->set_dtype(ToProto(q.dtype));
    out->set_queries(q.queries != nullptr ? static_cast<const char*>(q.queries) : "",
                     q.queries != nullptr ? q.bytes : 0);
    out->mutable_positions()->Add(q.positions.begin(), q.positions.end());
  }
  return SendCompress(*impl_, request, call);
}

absl::StatusOr<CompressResult> KvCacheClient::Compress(
    const std::string& sequence_id, const CompressionSpec& spec,
    const std::vector<LayerQueryStats>& query_stats, const CallOptions& call) {
  pb::CompressRequest request;
  request.set_sequence_id(sequence_id);
  ToProto(spec, request.mutable_spec());
  for (const LayerQueryStats& q : query_stats) {
    auto* out = request.add_query_stats();
    out->set_layer(q.layer);
    out->mutable_mean()->Add(q.mean.begin(), q.mean.end());
    out->mutable_covariance()->Add(q.covariance.begin(), q.covariance.end());
  }
  return SendCompress(*impl_, request, call);
}

absl::StatusOr<AttendResult> KvCacheClient::Attend(const AttendRequest& request,
                                                   const CallOptions& call) {
  pb::AttendRequest message;
  ToProto(request, &message);
  pb::AttendResponse response;
  // Not retried: each Attend adds to the tokens' H2O scores.
  const absl::Status status = impl_->Call(&StubKv::Attend, message, &response, call, Retried::kNo);
  if (!status.ok()) return status;
  return FromProto(response);
}

namespace {

class GrpcAttendSession final : public AttendSession {
 public:
  GrpcAttendSession(pb::KvCacheService::Stub* stub, const KvCacheClient::Impl& impl,
                    const CallOptions& call) {
    impl.Prepare(&context_, call);
    stream_ = stub->AttendStream(&context_);
  }
  GrpcAttendSession(const GrpcAttendSession&) = delete;
  GrpcAttendSession& operator=(const GrpcAttendSession&) = delete;

  absl::StatusOr<AttendResult> Attend(const AttendRequest& request) override {
    if (done_) return absl::FailedPreconditionError("the attend session is closed; call Finish()");
    request_.Clear();
    ToProto(request, &request_);
    if (!stream_->Write(request_) || !stream_->Read(&response_)) {
      done_ = true;
      stream_->WritesDone();
      const absl::Status status = FromGrpcStatus(stream_->Finish());
      finished_ = true;
      return status.ok() ? absl::AbortedError("the server closed the attend stream") : status;
    }
    return FromProto(response_);
  }

  absl::Status Finish() override {
    if (finished_) return absl::OkStatus();
    finished_ = done_ = true;
    stream_->WritesDone();
    return FromGrpcStatus(stream_->Finish());
  }

  ~GrpcAttendSession() override {
    if (!finished_) {
      context_.TryCancel();
      (void)stream_->Finish();
    }
  }

 private:
  grpc::ClientContext context_;
  pb::AttendRequest request_;
  pb::AttendResponse response_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::AttendRequest, pb::AttendResponse>> stream_;
  bool done_ = false;
  bool finished_ = false;
};

}  // namespace

std::unique_ptr<AttendSession> KvCacheClient::StartAttendSession(const CallOptions& call) {
  return std::make_unique<GrpcAttendSession>(impl_->kv.get(), *impl_, call);
}

}  // namespace kvc::client
