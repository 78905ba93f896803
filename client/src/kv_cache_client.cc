#include "kvc/client/kv_cache_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/channel/channel.h"
#include "client/src/append_streams.h"
#include "client/src/client_impl.h"
#include "client/src/convert.h"
#include "client/src/lease_decode.h"
#include "client/src/local_reader.h"
#include "client/src/staging_space.h"
#include "client/src/transfer_reader.h"
#include "common/mutex.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "proto/rpc_status.h"

namespace kvc::client {

namespace pb = ::kvcache::v1;
using internal::FromProto;
using internal::ToProto;

absl::StatusOr<std::unique_ptr<KvCacheClient>> KvCacheClient::Connect(
    const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("target is empty");
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts is ", options.max_attempts, "; expected >= 1"));
  }
  if (options.default_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_deadline must be positive");
  }
  auto channel = internal::CreateChannel(options);
  if (!channel.ok()) return channel.status();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->channel = *std::move(channel);
  impl->kv = pb::KvCacheService::NewStub(impl->channel);
  impl->admin = pb::AdminService::NewStub(impl->channel);
  return std::unique_ptr<KvCacheClient>(new KvCacheClient(std::move(impl)));
}

KvCacheClient::KvCacheClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
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
  grpc::ClientContext context;
  impl_->Prepare(&context, call);
  // Not retried: a lost reply would make a retry create a second sequence.
  const absl::Status status =
      FromGrpcStatus(impl_->kv->CreateSequence(&context, request, &response));
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
  grpc::ClientContext context;
  impl_->Prepare(&context, call);
  const absl::Status status = FromGrpcStatus(impl_->kv->ForkSequence(&context, request, &response));
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
  grpc::ClientContext context;
  impl_->Prepare(&context, call);
  const absl::Status status =
      FromGrpcStatus(impl_->kv->LeaseSequence(&context, request, &response));
  if (!status.ok()) return status;
  return FromProto(response);
}

absl::StatusOr<absl::Time> KvCacheClient::RenewLease(const std::string& lease_id,
                                                     absl::Duration ttl, const CallOptions& call) {
  pb::RenewLeaseRequest request;
  request.set_lease_id(lease_id);
  request.set_ttl_ms(absl::ToInt64Milliseconds(ttl));
  pb::RenewLeaseResponse response;
  const absl::Status status = impl_->Retry([&] {
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    return FromGrpcStatus(impl_->kv->RenewLease(&context, request, &response));
  });
  if (!status.ok()) return status;
  return absl::FromUnixMillis(response.expires_unix_ms());
}

absl::StatusOr<int64_t> KvCacheClient::ReleaseLease(const std::string& lease_id,
                                                    const CallOptions& call) {
  pb::ReleaseLeaseRequest request;
  request.set_lease_id(lease_id);
  pb::ReleaseLeaseResponse response;
  grpc::ClientContext context;
  impl_->Prepare(&context, call);
  const absl::Status status = FromGrpcStatus(impl_->kv->ReleaseLease(&context, request, &response));
  if (!status.ok()) return status;
  return response.freed_blocks();
}

absl::StatusOr<AppendResult> KvCacheClient::Append(const AppendChunk& chunk,
                                                   const CallOptions& call) {
  pb::AppendRequest request;
  const std::shared_ptr<internal::StagingSpace> staging =
      chunk.bytes > 0 ? LocalStaging(call) : nullptr;
  std::optional<internal::StagingSpace::Slot> slot =
      staging != nullptr ? internal::Stage(*staging, chunk, &request) : std::nullopt;
  if (!slot.has_value()) ToProto(chunk, &request);
  pb::AppendResponse response;
  grpc::ClientContext context;
  impl_->Prepare(&context, call);
  // Not retried: a retry after a lost reply would be refused as out of order.
  const absl::Status status = FromGrpcStatus(impl_->kv->Append(&context, request, &response));
  // Reusing those bytes while the server might still read them could mix two chunks into one
  // append: such a slot is never given out again.
  if (slot.has_value() && internal::ServerMayStillRead(status)) slot->Abandon();
  if (!status.ok()) return status;
  return AppendResult{response.layer_tokens(), response.visible_tokens()};
}

std::unique_ptr<AppendStream> KvCacheClient::StartAppendStream(const CallOptions& call) {
  if (std::shared_ptr<internal::StagingSpace> staging = LocalStaging(call); staging != nullptr) {
    return internal::MakeStagedAppendStream(
        *impl_, std::move(staging),
        call.deadline > absl::ZeroDuration() ? call.deadline : impl_->options.default_deadline);
  }
  return internal::MakeGrpcAppendStream(*impl_, call);
}

absl::StatusOr<DeviceArenaHandle> KvCacheClient::ShareDeviceArena(const std::string& pool,
                                                                  StorageFormat format,
                                                                  const CallOptions& call) {
  const std::shared_ptr<internal::LocalReader> local = LocalPath(call);
  if (local == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no same-node path to the server: ", DataPath()));
  }
  absl::StatusOr<DeviceArenaHandle> handle = local->DeviceArena(pool, format);
  if (!handle.ok() && absl::StrContains(handle.status().message(), " not found; this server has")) {
    return absl::NotFoundError(handle.status().message());
  }
  return handle;
}

std::string KvCacheClient::DataPath() const {
  kvc::MutexLock lock(&impl_->local_mu);
  return impl_->data_path;
}

std::string KvCacheClient::AppendPath() const {
  kvc::MutexLock lock(&impl_->local_mu);
  return impl_->append_path;
}

std::shared_ptr<internal::StagingSpace> KvCacheClient::LocalStaging(const CallOptions& call) {
  {
    kvc::MutexLock lock(&impl_->local_mu);
    if (impl_->options.staging_bytes <= 0) {
      impl_->staging_decided = true;
      impl_->append_path = "grpc (staging_bytes is 0)";
      return nullptr;
    }
  }
  // Every time, not only the first: after a restart it drops the old server's region too.
  const std::shared_ptr<internal::LocalReader> local = LocalPath(call);
  kvc::MutexLock lock(&impl_->local_mu);
  if (impl_->staging_decided) return impl_->staging;  // another thread was first
  if (local == nullptr) {
    // Undecided while the server is unreachable, as the read path is.
    impl_->staging_decided = impl_->local_decided;
    impl_->append_path = impl_->transfer != nullptr
                             ? "grpc (no same-node path; transfer channels carry reads only)"
                             : impl_->data_path;
    return nullptr;
  }
  if (local != impl_->local) return nullptr;  // dropped meanwhile: the next Append decides
  absl::StatusOr<std::unique_ptr<internal::StagingSpace>> space =
      local->OpenStaging(impl_->options.staging_bytes);
  impl_->staging_decided = true;
  if (!space.ok()) {
    impl_->append_path = absl::StrCat("grpc (", space.status().message(), ")");
    return nullptr;
  }
  impl_->staging = *std::move(space);
  impl_->append_path = absl::StrCat("staged (", impl_->staging->bytes(), "-byte region)");
  return impl_->staging;
}

namespace {

// The host part of a gRPC target ("host:port", "dns:///host:port", "ipv4:h:p", "[::1]:p");
// "" for unix sockets and anything else without one.
std::string TargetHost(std::string target) {
  if (absl::StartsWith(target, "unix:")) return "";
  for (const char* scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(target, scheme)) {
      target = target.substr(std::strlen(scheme));
      break;
    }
  }
  target = target.substr(0, target.find(','));  // ipv4:a:p,b:p -> the first address
  const auto colon = target.rfind(':');
  std::string host = colon == std::string::npos ? target : target.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace

std::shared_ptr<internal::LocalReader> KvCacheClient::LocalPath(const CallOptions& call) {
  kvc::MutexLock lock(&impl_->local_mu);
  if (impl_->local_decided) {
    if (impl_->transfer != nullptr) {
      if (impl_->transfer->Alive()) return nullptr;
      // The channel broke (or the server hung up): decide again.
      impl_->transfer.reset();
      impl_->local_decided = false;
    } else if (impl_->local == nullptr || impl_->local->Alive()) {
      return impl_->local;
    } else {
      // The server's end closed (it exited or restarted) or a lease of another server came
      // by: the mappings and the staging region are of memory that server no longer
      // serves. Decide again; calls still holding the old reader finish with it (their
      // leases are checked against its token).
      impl_->local.reset();
      impl_->local_decided = false;
      impl_->staging.reset();
      impl_->staging_decided = false;
      impl_->append_path = "grpc (no Append since the local socket closed)";
    }
  }
  if (!impl_->options.local_reads && !impl_->options.transfers) {
    impl_->local_decided = true;
    impl_->data_path = "grpc (local_reads and transfers are off)";
    return nullptr;
  }
  absl::StatusOr<ServerInfo> info = GetServerInfo(call);
  // Unreachable now: the next Fetch asks again (the server may be starting). Any other
  // failure (an older server, a proxy without AdminService) decides for gRPC.
  impl_->local_decided =
      !absl::IsUnavailable(info.status()) && !absl::IsDeadlineExceeded(info.status());
  if (!info.ok()) {
    impl_->data_path = absl::StrCat("grpc (GetServerInfo failed: ", info.status().message(), ")");
    return nullptr;
  }
  std::string why_not_local = "local_reads is off";
  if (impl_->options.local_reads) {
    why_not_local = "the server has no local_socket";
    if (!info->local_socket.empty()) {
      absl::StatusOr<std::unique_ptr<internal::LocalReader>> reader =
          internal::LocalReader::Connect(info->local_socket, info->local_token);
      if (reader.ok()) {
        impl_->local = *std::move(reader);
        impl_->data_path = absl::StrCat("shared-memory (", info->local_socket, ")");
        return impl_->local;
      }
      why_not_local = std::string(reader.status().message());
    }
  }
  // No same-node path: a transfer channel, if the server offers one.
  std::string why_not_transfer;
  if (info->transfer_port > 0 && !impl_->options.transfers) {
    why_not_transfer = "; transfers are off";
  } else if (info->transfer_port > 0) {
    absl::StatusOr<std::unique_ptr<internal::TransferReader>> transfer = OpenTransfer(call);
    if (transfer.ok()) {
      impl_->transfer = *std::move(transfer);
      impl_->data_path = absl::StrCat("transfer (", impl_->transfer->where(), ")");
      return nullptr;
    }
    why_not_transfer = absl::StrCat("; transfer: ", transfer.status().message());
  }
  impl_->data_path = absl::StrCat("grpc (", why_not_local, why_not_transfer, ")");
  return nullptr;
}

absl::StatusOr<std::unique_ptr<internal::TransferReader>> KvCacheClient::OpenTransfer(
    const CallOptions& call) {
  pb::OpenTransferResponse response;
  {
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    const absl::Status status =
        FromGrpcStatus(impl_->kv->OpenTransfer(&context, pb::OpenTransferRequest(), &response));
    if (!status.ok()) return status;
  }
  const std::string host =
      response.host().empty() ? TargetHost(impl_->options.target) : response.host();
  absl::StatusOr<std::unique_ptr<internal::TransferReader>> reader =
      host.empty()
          ? absl::FailedPreconditionError("the target names no host to connect to (a unix socket?)")
          : internal::TransferReader::Connect(host, response.port(), response.transfer_id(),
                                              response.token());
  if (!reader.ok()) {
    // Best effort: an unconnected channel is dropped by the server after connect_within.
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    pb::CloseTransferRequest close;
    close.set_transfer_id(response.transfer_id());
    pb::CloseTransferResponse closed;
    (void)impl_->kv->CloseTransfer(&context, close, &closed);
  }
  return reader;
}

std::shared_ptr<internal::TransferReader> KvCacheClient::TransferPath(const CallOptions& call) {
  if (LocalPath(call) != nullptr) return nullptr;
  kvc::MutexLock lock(&impl_->local_mu);
  return impl_->transfer;
}

absl::StatusOr<internal::ReceivedBlocks> KvCacheClient::ReceiveLeased(
    internal::TransferReader& transfer, const std::string& sequence_id,
    const std::vector<int32_t>& layers, const CallOptions& call, bool* channel_failed) {
  *channel_failed = false;
  absl::StatusOr<Lease> lease = LeaseSequence(sequence_id, layers, absl::ZeroDuration(), call);
  if (!lease.ok()) return lease.status();
  const absl::Duration budget =
      call.deadline > absl::ZeroDuration() ? call.deadline : impl_->options.default_deadline;
  absl::StatusOr<internal::ReceivedBlocks> got = transfer.Fetch(
      *lease,
      [&](uint64_t nonce) {
        pb::SendLeaseRequest request;
        request.set_transfer_id(transfer.id());
        request.set_lease_id(lease->lease_id);
        request.set_nonce(nonce);
        pb::SendLeaseResponse response;
        grpc::ClientContext context;
        impl_->Prepare(&context, call);
        return FromGrpcStatus(impl_->kv->SendLease(&context, request, &response));
      },
      absl::Now() + budget);
  // The blocks are this process's copy now: the lease can end before they are decoded.
  (void)ReleaseLease(lease->lease_id, call);  // best effort: the TTL ends it otherwise
  *channel_failed = !got.ok() && !transfer.Alive();
  return got;
}

absl::Status KvCacheClient::FetchChunks(const std::string& sequence_id, const FetchOptions& options,
                                        const std::function<absl::Status(FetchedChunk&)>& on_chunk,
                                        const CallOptions& call) {
  if (const std::shared_ptr<internal::LocalReader> local = LocalPath(call); local != nullptr) {
    const std::vector<int32_t> layers(options.layers.begin(), options.layers.end());
    absl::StatusOr<Lease> lease = LeaseSequence(sequence_id, layers, absl::ZeroDuration(), call);
    if (!lease.ok()) return lease.status();
    absl::Status read = lease->device == "cpu" ? local->ReadLeased(*lease, options, on_chunk)
                                               : absl::UnimplementedError("device pool");
    // Ending the lease is best effort: if this call fails, the TTL ends it.
    (void)ReleaseLease(lease->lease_id, call);
    if (!absl::IsUnimplemented(read)) return read;
    // A device pool's arenas cannot be mapped here, or the lease is of another server than
    // the socket's (it restarted): the records come over gRPC.
  } else if (const std::shared_ptr<internal::TransferReader> transfer = TransferPath(call);
             transfer != nullptr) {
    const std::vector<int32_t> layers(options.layers.begin(), options.layers.end());
    bool channel_failed = false;
    absl::StatusOr<internal::ReceivedBlocks> got =
        ReceiveLeased(*transfer, sequence_id, layers, call, &channel_failed);
    if (got.ok()) {
      absl::Status read = internal::ReadLeased(got->lease, options, got->arenas(), on_chunk);
      transfer->Recycle(*std::move(got));
      return read;
    }
    if (!channel_failed) return got.status();
    // The channel broke: this call reads over gRPC; the next one decides the path again.
  }
  return FetchChunksOverGrpc(sequence_id, options, on_chunk, call);
}

absl::Status KvCacheClient::FetchChunksOverGrpc(
    const std::string& sequence_id, const FetchOptions& options,
    const std::function<absl::Status(FetchedChunk&)>& on_chunk, const CallOptions& call) {
  pb::FetchRequest request;
  request.set_sequence_id(sequence_id);
  for (int layer : options.layers) request.add_layers(layer);
  request.set_format(options.stored_format ? pb::FETCH_FORMAT_STORED : pb::FETCH_FORMAT_DENSE);
  request.set_dtype(ToProto(options.dtype));
  request.set_max_chunk_bytes(options.max_chunk_bytes);
  request.set_include_unfinished(options.include_unfinished);
  // Retried only while no chunk has been delivered, so the caller never sees duplicates; a
  // stream that broke after a chunk is the caller's error, never a truncated success.
  bool delivered = false;
  return impl_->Retry(
      [&]() -> absl::Status {
        grpc::ClientContext context;
        impl_->Prepare(&context, call);
        auto reader = impl_->kv->Fetch(&context, request);
        pb::FetchChunk message;
        absl::Status callback_status;
        while (reader->Read(&message)) {
          delivered = true;
          FetchedChunk chunk = FromProto(message);
          callback_status = on_chunk(chunk);
          if (!callback_status.ok()) {
            context.TryCancel();
            break;
          }
        }
        absl::Status status = FromGrpcStatus(reader->Finish());
        if (!callback_status.ok()) return callback_status;
        if (!status.ok() && delivered) {
          // A stream that broke midway cannot be resumed transparently.
          return absl::Status(status.code(),
                              absl::StrCat("Fetch broke after some chunks: ", status.message()));
        }
        return status;
      },
      [&] { return !delivered; });
}

absl::StatusOr<FetchResult> KvCacheClient::Fetch(const std::string& sequence_id,
                                                 const FetchOptions& options,
                                                 const CallOptions& call) {
  FetchResult result;
  std::vector<std::pair<int, int>> order;  // (layer, head) of result.heads
  const absl::Status status = FetchChunks(
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
      call);
  if (!status.ok()) return status;
  return result;
}

namespace {

// What FetchInto can check before asking the server anything; the buffers' layers.
absl::StatusOr<std::vector<int32_t>> CheckBuffers(const std::vector<LayerBuffers>& buffers,
                                                  const FetchIntoOptions& options) {
  if (options.dtype != DType::kF16 && options.dtype != DType::kBF16 &&
      options.dtype != DType::kF32) {
    return absl::InvalidArgumentError("FetchInto: options.dtype must be F16, BF16 or F32");
  }
  if (options.num_kv_heads <= 0 || options.head_dim <= 0) {
    return absl::InvalidArgumentError("FetchInto: options.num_kv_heads and head_dim must be > 0");
  }
  if (buffers.empty()) return absl::InvalidArgumentError("FetchInto: no buffers");
  std::vector<int32_t> layers;
  for (const LayerBuffers& b : buffers) {
    if (b.keys == nullptr || b.values == nullptr || b.capacity_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrCat("FetchInto: the buffers of layer ", b.layer,
                                                     " need keys, values and capacity >= 0"));
    }
    if (std::find(layers.begin(), layers.end(), b.layer) != layers.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("FetchInto: layer ", b.layer, " has two buffers"));
    }
    layers.push_back(b.layer);
  }
  return layers;
}

}  // namespace

absl::StatusOr<FetchIntoResult> KvCacheClient::FetchInto(const std::string& sequence_id,
                                                         const std::vector<LayerBuffers>& buffers,
                                                         const FetchIntoOptions& options,
                                                         const CallOptions& call) {
  absl::StatusOr<std::vector<int32_t>> checked = CheckBuffers(buffers, options);
  if (!checked.ok()) return checked.status();
  const std::vector<int32_t>& layers = *checked;
  if (const std::shared_ptr<internal::LocalReader> local = LocalPath(call); local != nullptr) {
    absl::StatusOr<Lease> lease = LeaseSequence(sequence_id, layers, absl::ZeroDuration(), call);
    if (!lease.ok()) return lease.status();
    FetchIntoResult result;
    absl::Status read = lease->device == "cpu"
                            ? local->ReadLeasedInto(*lease, buffers, options, &result)
                            : absl::UnimplementedError("device pool");
    (void)ReleaseLease(lease->lease_id, call);  // best effort: the TTL ends it otherwise
    if (read.ok()) return result;
    if (!absl::IsUnimplemented(read)) return read;
  } else if (const std::shared_ptr<internal::TransferReader> transfer = TransferPath(call);
             transfer != nullptr) {
    bool channel_failed = false;
    absl::StatusOr<internal::ReceivedBlocks> got =
        ReceiveLeased(*transfer, sequence_id, layers, call, &channel_failed);
    if (got.ok()) {
      FetchIntoResult result;
      absl::Status read =
          internal::ReadLeasedInto(got->lease, buffers, options, got->arenas(), &result);
      transfer->Recycle(*std::move(got));
      if (!read.ok()) return read;
      return result;
    }
    if (!channel_failed) return got.status();
  }
  // Over gRPC: the shape comes from GetSequence (a lane with no tokens sends no chunk), the
  // rows from the dense chunks, copied in as they arrive.
  absl::StatusOr<SequenceInfo> info = GetSequence(sequence_id, call);
  if (!info.ok()) return info.status();
  const size_t heads = static_cast<size_t>(options.num_kv_heads);
  if (info->layer_tokens.empty() ||
      info->stored_tokens.size() != info->layer_tokens.size() * heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the buffers are for ", options.num_kv_heads, " kv heads but the sequence has ",
        info->layer_tokens.empty() ? 0 : info->stored_tokens.size() / info->layer_tokens.size()));
  }
  const size_t row = static_cast<size_t>(options.head_dim) * (options.dtype == DType::kF32 ? 4 : 2);
  FetchIntoResult result;
  result.lane_tokens.assign(buffers.size() * heads, 0);
  std::vector<std::vector<int32_t>> positions(options.positions ? result.lane_tokens.size() : 0);
  FetchOptions fetch;
  fetch.layers.assign(layers.begin(), layers.end());
  fetch.dtype = options.dtype;
  fetch.include_unfinished = options.include_unfinished;
  // Straight to gRPC: the same-node path, if any, was tried above.
  absl::Status status = FetchChunksOverGrpc(
      sequence_id, fetch,
      [&](FetchedChunk& chunk) -> absl::Status {
        const size_t b = static_cast<size_t>(std::find(layers.begin(), layers.end(), chunk.layer) -
                                             layers.begin());
        if (b == layers.size() || chunk.kv_head < 0 ||
            static_cast<size_t>(chunk.kv_head) >= heads) {
          return absl::InternalError(absl::StrCat("Fetch sent layer ", chunk.layer, " kv head ",
                                                  chunk.kv_head, ", which was not asked for"));
        }
        const size_t lane = b * heads + static_cast<size_t>(chunk.kv_head);
        const auto n = static_cast<size_t>(chunk.num_tokens);
        if (chunk.keys.size() != n * row || chunk.values.size() != n * row) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the buffers are for head_dim ", options.head_dim, " but the sequence has ",
              n == 0 ? 0 : chunk.keys.size() / n / (row / static_cast<size_t>(options.head_dim))));
        }
        const int64_t end = chunk.first_index + chunk.num_tokens;
        if (chunk.first_index != result.lane_tokens[lane]) {
          return absl::InternalError("Fetch chunks of a lane arrived out of order");
        }
        if (end > buffers[b].capacity_tokens) {
          return absl::OutOfRangeError(
              absl::StrCat("layer ", chunk.layer, " kv head ", chunk.kv_head, " holds more than ",
                           buffers[b].capacity_tokens, " tokens (its buffers' capacity)"));
        }
        const size_t at =
            (static_cast<size_t>(chunk.kv_head) * static_cast<size_t>(buffers[b].capacity_tokens) +
             static_cast<size_t>(chunk.first_index)) *
            row;
        std::memcpy(static_cast<char*>(buffers[b].keys) + at, chunk.keys.data(), n * row);
        std::memcpy(static_cast<char*>(buffers[b].values) + at, chunk.values.data(), n * row);
        result.lane_tokens[lane] = end;
        result.visible_tokens = chunk.visible_tokens;
        if (options.positions) {
          positions[lane].insert(positions[lane].end(), chunk.positions.begin(),
                                 chunk.positions.end());
        }
        return absl::OkStatus();
      },
      call);
  if (!status.ok()) return status;
  if (result.visible_tokens == 0) result.visible_tokens = info->visible_tokens;
  for (const std::vector<int32_t>& p : positions) {
    result.positions.insert(result.positions.end(), p.begin(), p.end());
  }
  return result;
}

absl::StatusOr<SequenceInfo> KvCacheClient::GetSequence(const std::string& sequence_id,
                                                        const CallOptions& call) {
  pb::GetSequenceRequest request;
  request.set_sequence_id(sequence_id);
  pb::SequenceInfo response;
  const absl::Status status = impl_->Retry([&] {
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    return FromGrpcStatus(impl_->kv->GetSequence(&context, request, &response));
  });
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
  const absl::Status status = impl_->Retry([&] {
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    return FromGrpcStatus(impl_->kv->LookupPrefix(&context, request, &response));
  });
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
  const absl::Status status = impl_->Retry([&] {
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    return FromGrpcStatus(impl_->kv->PublishPrefix(&context, request, &response));
  });
  if (!status.ok()) return status;
  return PublishResult{response.published_tokens(), response.new_tokens()};
}

absl::StatusOr<ReleaseResult> KvCacheClient::Release(const std::string& sequence_id,
                                                     const CallOptions& call) {
  pb::ReleaseRequest request;
  request.set_sequence_id(sequence_id);
  pb::ReleaseResponse response;
  grpc::ClientContext context;
  impl_->Prepare(&context, call);
  const absl::Status status = FromGrpcStatus(impl_->kv->Release(&context, request, &response));
  if (!status.ok()) return status;
  return ReleaseResult{response.freed_blocks(), response.freed_bytes()};
}

namespace {

absl::StatusOr<CompressResult> SendCompress(const KvCacheClient::Impl& impl,
                                            const pb::CompressRequest& request,
                                            const CallOptions& call) {
  pb::CompressResponse response;
  grpc::ClientContext context;
  impl.Prepare(&context, call);
  // Not retried: a second Compress after a lost reply would evict again.
  const absl::Status status = FromGrpcStatus(impl.kv->Compress(&context, request, &response));
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
  grpc::ClientContext context;
  impl_->Prepare(&context, call);
  // Not retried: each Attend adds to the tokens' H2O scores.
  const absl::Status status = FromGrpcStatus(impl_->kv->Attend(&context, message, &response));
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

absl::StatusOr<std::vector<PoolInfo>> KvCacheClient::ListPools(const CallOptions& call) {
  pb::ListPoolsResponse response;
  const absl::Status status = impl_->Retry([&] {
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    return FromGrpcStatus(impl_->admin->ListPools(&context, pb::ListPoolsRequest(), &response));
  });
  if (!status.ok()) return status;
  std::vector<PoolInfo> pools;
  for (const auto& pool : response.pools()) pools.push_back(FromProto(pool));
  return pools;
}

absl::StatusOr<PoolStats> KvCacheClient::GetPoolStats(const std::string& pool,
                                                      const CallOptions& call) {
  pb::GetPoolStatsRequest request;
  request.set_pool(pool);
  pb::PoolStats response;
  const absl::Status status = impl_->Retry([&] {
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    return FromGrpcStatus(impl_->admin->GetPoolStats(&context, request, &response));
  });
  if (!status.ok()) return status;
  return FromProto(response);
}

absl::StatusOr<SequenceList> KvCacheClient::ListSequences(const ListSequencesOptions& options,
                                                          const CallOptions& call) {
  pb::ListSequencesRequest request;
  request.set_pool(options.pool);
  request.set_tenant(options.tenant);
  request.set_limit(options.limit);
  pb::ListSequencesResponse response;
  const absl::Status status = impl_->Retry([&] {
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    return FromGrpcStatus(impl_->admin->ListSequences(&context, request, &response));
  });
  if (!status.ok()) return status;
  SequenceList list;
  for (const auto& s : response.sequences()) list.sequences.push_back(FromProto(s));
  list.total = response.total();
  return list;
}

absl::StatusOr<std::vector<TenantUsage>> KvCacheClient::ListTenants(const CallOptions& call) {
  pb::ListTenantsResponse response;
  const absl::Status status = impl_->Retry([&] {
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    return FromGrpcStatus(impl_->admin->ListTenants(&context, pb::ListTenantsRequest(), &response));
  });
  if (!status.ok()) return status;
  std::vector<TenantUsage> out;
  for (const auto& t : response.tenants()) {
    TenantUsage u;
    u.tenant = t.tenant();
    u.sequences = t.sequences();
    for (const auto& [pool, bytes] : t.pool_bytes()) u.pool_bytes.emplace_back(pool, bytes);
    std::sort(u.pool_bytes.begin(), u.pool_bytes.end());
    u.open_streams = t.open_streams();
    u.compute_calls = t.compute_calls();
    u.quota_bytes_per_pool = t.quota_bytes_per_pool();
    u.quota_sequences = t.quota_sequences();
    u.quota_streams = t.quota_streams();
    u.quota_compute_calls = t.quota_compute_calls();
    out.push_back(std::move(u));
  }
  return out;
}

absl::StatusOr<bool> KvCacheClient::Drain(bool resume, const CallOptions& call) {
  pb::DrainRequest request;
  request.set_resume(resume);
  pb::DrainResponse response;
  // Idempotent (it sets a state), so retried like the reads.
  const absl::Status status = impl_->Retry([&] {
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    return FromGrpcStatus(impl_->admin->Drain(&context, request, &response));
  });
  if (!status.ok()) return status;
  return response.draining();
}

absl::StatusOr<ServerInfo> KvCacheClient::GetServerInfo(const CallOptions& call) {
  pb::ServerInfo response;
  const absl::Status status = impl_->Retry([&] {
    grpc::ClientContext context;
    impl_->Prepare(&context, call);
    return FromGrpcStatus(
        impl_->admin->GetServerInfo(&context, pb::GetServerInfoRequest(), &response));
  });
  if (!status.ok()) return status;
  return ServerInfo{response.shard(),       response.incarnation(),     response.weight(),
                    response.draining(),    response.started_unix_ms(), response.local_socket(),
                    response.local_token(), response.transfer_port()};
}

}  // namespace kvc::client
