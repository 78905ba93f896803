// KvCacheClient's data-path decision: whether reads go through the same-node mapping
// (local_reader.h), a transfer channel (transfer_reader.h) or gRPC, and whether appends are
// staged (staging_space.h). Decided on first use, and again after a path broke or the server
// restarted; DataPath()/AppendPath() say what was decided and why.
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/src/client_impl.h"
#include "client/src/local_reader.h"
#include "client/src/read_path.h"
#include "client/src/staging_space.h"
#include "client/src/transfer_reader.h"
#include "common/mutex.h"
#include "kvc/client/admin_client.h"
#include "kvc/client/kv_cache_client.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "proto/rpc_status.h"

namespace kvc::client {

namespace pb = ::kvcache::v1;

std::string KvCacheClient::DataPath() const {
  kvc::MutexLock lock(&impl_->local_mu);
  return impl_->data_path;
}

std::string KvCacheClient::AppendPath() const {
  kvc::MutexLock lock(&impl_->local_mu);
  return impl_->append_path;
}

namespace internal {

std::shared_ptr<StagingSpace> LocalStaging(KvCacheClient& client, KvCacheClient::Impl& impl,
                                           const CallOptions& call) {
  {
    kvc::MutexLock lock(&impl.local_mu);
    if (impl.options.staging_bytes <= 0) {
      impl.staging_decided = true;
      impl.append_path = "grpc (staging_bytes is 0)";
      return nullptr;
    }
  }
  // Every time, not only the first: after a restart it drops the old server's region too.
  const std::shared_ptr<LocalReader> local = LocalPath(client, impl, call);
  kvc::MutexLock lock(&impl.local_mu);
  if (impl.staging_decided) return impl.staging;  // another thread was first
  if (local == nullptr) {
    // Undecided while the server is unreachable, as the read path is.
    impl.staging_decided = impl.local_decided;
    impl.append_path = impl.reads != nullptr
                           ? "grpc (no same-node path; transfer channels carry reads only)"
                           : impl.data_path;
    return nullptr;
  }
  if (local != impl.local) return nullptr;  // dropped meanwhile: the next Append decides
  absl::StatusOr<std::unique_ptr<StagingSpace>> space =
      local->OpenStaging(impl.options.staging_bytes);
  impl.staging_decided = true;
  if (!space.ok()) {
    impl.append_path = absl::StrCat("grpc (", space.status().message(), ")");
    return nullptr;
  }
  impl.staging = *std::move(space);
  impl.append_path = absl::StrCat("staged (", impl.staging->bytes(), "-byte region)");
  return impl.staging;
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

namespace {

// OpenTransfer, then a connection to the channel (closed again if the connection fails).
absl::StatusOr<std::unique_ptr<TransferReader>> OpenTransfer(const KvCacheClient::Impl& impl,
                                                             const CallOptions& call) {
  pb::OpenTransferResponse response;
  const absl::Status opened =
      impl.Call(&StubKv::OpenTransfer, pb::OpenTransferRequest(), &response, call, Retried::kNo);
  if (!opened.ok()) return opened;
  TransferEndpoint at;
  at.host = response.host().empty() ? TargetHost(impl.options.target) : response.host();
  at.port = response.port();
  at.transfer_id = response.transfer_id();
  at.token = response.token();
  at.frame_key = response.frame_key();
  absl::StatusOr<std::unique_ptr<TransferReader>> reader =
      absl::FailedPreconditionError("the target names no host to connect to (a unix socket?)");
  if (response.tls()) {
    // The listener's certificate is the gRPC listener's: verified the same way.
    const ClientTlsOptions& tls = impl.options.tls;
    at.server_name = tls.server_name.empty() ? at.host : tls.server_name;
    absl::StatusOr<std::shared_ptr<transfer::TlsContext>> context =
        tls.ca_file.empty()
            ? absl::FailedPreconditionError(
                  "the server's transfers speak TLS but this client has no CA (tls.ca_file)")
            : transfer::TlsContext::Client(tls.ca_file, tls.cert_file, tls.key_file);
    if (context.ok()) {
      at.tls = *std::move(context);
    } else {
      reader = context.status();
    }
  }
  if (!at.host.empty() && (!response.tls() || at.tls != nullptr)) {
    reader = TransferReader::Connect(at);
  }
  if (!reader.ok()) {
    // Best effort: an unconnected channel is dropped by the server after connect_within.
    pb::CloseTransferRequest close;
    close.set_transfer_id(response.transfer_id());
    pb::CloseTransferResponse closed;
    (void)impl.Call(&StubKv::CloseTransfer, close, &closed, call, Retried::kNo);
  }
  return reader;
}

}  // namespace

std::shared_ptr<LocalReader> LocalPath(KvCacheClient& client, KvCacheClient::Impl& impl,
                                       const CallOptions& call) {
  (void)ReadPathFor(client, impl, call);
  kvc::MutexLock lock(&impl.local_mu);
  return impl.local;
}

// The selector. Its state (Impl): undecided, or decided on `reads` (null: gRPC), with `local`
// set when that is the same-node path (staging and device arenas use its connection).
std::shared_ptr<ReadPath> ReadPathFor(KvCacheClient& client, KvCacheClient::Impl& impl,
                                      const CallOptions& call) {
  kvc::MutexLock lock(&impl.local_mu);
  if (impl.local_decided) {
    if (impl.reads == nullptr) return impl.grpc_reads;
    if (impl.reads->Alive()) return impl.reads;
    // The path broke: the server's end of the socket closed (it exited or restarted: the
    // mappings and the staging region are of memory that server no longer serves), a lease
    // of another server came by, or the channel failed. Decide again; calls still holding
    // the old path finish with it (their leases are checked against its server's token).
    impl.reads.reset();
    impl.local_decided = false;
    if (impl.local != nullptr) {
      impl.local.reset();
      impl.staging.reset();
      impl.staging_decided = false;
      impl.append_path = "grpc (no Append since the local socket closed)";
    }
  }
  if (!impl.options.local_reads && !impl.options.transfers) {
    impl.local_decided = true;
    impl.data_path = "grpc (local_reads and transfers are off)";
    return impl.grpc_reads;
  }
  absl::StatusOr<ServerInfo> info = AdminClient::Over(client).GetServerInfo(call);
  // Unreachable now: the next Fetch asks again (the server may be starting). Any other
  // failure (an older server, a proxy without AdminService) decides for gRPC.
  impl.local_decided =
      !absl::IsUnavailable(info.status()) && !absl::IsDeadlineExceeded(info.status());
  if (!info.ok()) {
    impl.data_path = absl::StrCat("grpc (GetServerInfo failed: ", info.status().message(), ")");
    return impl.grpc_reads;
  }
  std::string why_not_local = "local_reads is off";
  if (impl.options.local_reads) {
    why_not_local = "the server has no local_socket";
    if (!info->local_socket.empty()) {
      absl::StatusOr<std::unique_ptr<LocalReader>> reader =
          LocalReader::Connect(info->local_socket, info->local_token, impl.options.bearer_token);
      if (reader.ok()) {
        impl.local = *std::move(reader);
        impl.reads = MakeLocalReadPath(client, impl.local);
        impl.data_path = impl.reads->name();
        return impl.reads;
      }
      why_not_local = std::string(reader.status().message());
    }
  }
  // No same-node path: a transfer channel, if the server offers one.
  std::string why_not_transfer;
  if (info->transfer_port > 0 && !impl.options.transfers) {
    why_not_transfer = "; transfers are off";
  } else if (info->transfer_port > 0) {
    absl::StatusOr<std::unique_ptr<TransferReader>> transfer = OpenTransfer(impl, call);
    if (transfer.ok()) {
      impl.reads = MakeTransferReadPath(client, *std::move(transfer));
      impl.data_path = impl.reads->name();
      return impl.reads;
    }
    why_not_transfer = absl::StrCat("; transfer: ", transfer.status().message());
  }
  impl.data_path = absl::StrCat("grpc (", why_not_local, why_not_transfer, ")");
  return impl.grpc_reads;
}

}  // namespace internal
}  // namespace kvc::client
