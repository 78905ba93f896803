#include "cachesvc/server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "cachesvc/rpc/admin_service.h"
#include "cachesvc/rpc/kv_cache_service.h"
#include "cachesvc/security/access_control.h"
#include "cachesvc/security/tls_credentials.h"
#include "cachesvc/transport/local_socket.h"
#include "cachesvc/transport/nccl_channels.h"
#include "cachesvc/transport/staging_regions.h"
#include "cachesvc/transport/tcp_channels.h"
#include "cachesvc/transport/transfers.h"
#include "common/logging.h"
#include "common/random_id.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

KvCacheServer::KvCacheServer() = default;

KvCacheServer::~KvCacheServer() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
}

absl::StatusOr<std::unique_ptr<KvCacheServer>> KvCacheServer::Start(const ServerOptions& options) {
  if (options.max_message_bytes < (int64_t{64} << 10) ||
      options.max_message_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes is ", options.max_message_bytes, "; expected 64 KiB .. 1 GiB"));
  }
  KVC_RETURN_IF_ERROR(CheckExposure(options));
  // A transfer channel's bytes are not encrypted: next to a TLS listener it would undo what
  // TLS protects.
  if (!options.transfer_nccl_library.empty() && options.tls.enabled() &&
      !options.transfer_nccl_trusted_fabric) {
    return absl::FailedPreconditionError(
        "transfer_nccl_library carries KV in the clear and cannot be combined with tls unless "
        "transfer_nccl_trusted_fabric says the GPUs' fabric is trusted");
  }
  if (options.insecure && !IsLoopback(options.listen)) {
    KVC_LOG(WARNING) << "INSECURE: listening on '" << options.listen
                     << "' without TLS or authentication because the config sets insecure: "
                     << "true; anyone who reaches the port can read and change every "
                     << "tenant's KV";
  }
  // Before the pools: a bad certificate or key fails startup at once, naming the file.
  KVC_ASSIGN_OR_RETURN(const std::shared_ptr<grpc::ServerCredentials> credentials,
                       MakeServerCredentials(options.tls));
  std::unique_ptr<KvCacheServer> server(new KvCacheServer());
  KVC_ASSIGN_OR_RETURN(server->auth_, Authenticator::Create(options.auth));
  server->limits_ = std::make_unique<CallLimits>(options.store.quotas);
  // A response must fit one message; leave room for the fields around the payload.
  KvStoreOptions store_options = options.store;
  store_options.max_response_bytes = options.max_message_bytes - (int64_t{16} << 10);
  KVC_ASSIGN_OR_RETURN(server->store_, KvStore::Create(store_options));
  KVC_ASSIGN_OR_RETURN(server->metrics_,
                       Metrics::Create(options.metrics_listen, server->store_.get(),
                                       /*name_all_tenants=*/options.auth.enabled()));
  if (!options.local_socket.empty()) {
    // A random token: the greeting proves a client reached this server, not another one
    // listening at the same path on another node or in another run.
    const std::string token = RandomId("");
    LocalSocketOptions local;
    local.path = options.local_socket;
    local.uids.assign(options.local_socket_uids.begin(), options.local_socket_uids.end());
    local.allow_same_uid = options.local_socket_allow_same_uid;
    local.token = token;
    // The socket's peers prove their tenant with the same bearer token as gRPC callers.
    local.authenticate =
        [auth = server->auth_.get()](const std::string& bearer) -> absl::StatusOr<TenantScope> {
      if (!auth->enabled()) return TenantScope();
      KVC_ASSIGN_OR_RETURN(const Caller caller, auth->AuthenticateToken(bearer));
      return OwnScope(caller);
    };
    local.on_event = [metrics = server->metrics_.get()](const char* event) {
      metrics->RecordLocalSocketEvent(event);
    };
    if (options.local_socket_allow_same_uid) {
      KVC_LOG(WARNING) << "local_socket admits kvcached's own uid: every process of that uid "
                       << "is trusted with every tenant's KV (it can read this process's "
                       << "memory anyway)";
    }
    server->staging_ = std::make_unique<StagingRegions>(options.local_staging_bytes_per_tenant,
                                                        options.local_staging_bytes_total);
    KVC_ASSIGN_OR_RETURN(server->local_socket_, LocalSocket::Start(local, &server->store_->leases(),
                                                                   server->staging_.get()));
    server->endpoints_.local_socket = options.local_socket;
    server->endpoints_.local_token = token;
    KVC_LOG(INFO)
        << "same-node readers map host pools (device pools: CUDA IPC) through unix socket "
        << options.local_socket;
  }
  if (!options.transfer_listen.empty()) {
    TcpChannelOptions transfer;
    transfer.listen = options.transfer_listen;
    transfer.advertise_host = options.transfer_advertise_host;
    // Under the gRPC listener's TLS, the transfer listener speaks TLS with the same files.
    transfer.tls_cert_file = options.tls.cert_file;
    transfer.tls_key_file = options.tls.key_file;
    transfer.on_event = [metrics = server->metrics_.get()](const char* event) {
      metrics->RecordTransferEvent(event);
    };
    KVC_ASSIGN_OR_RETURN(server->tcp_, TcpChannels::Start(transfer, &server->store_->leases()));
    server->endpoints_.transfer_port = server->tcp_->port();
    server->transfers_.Offer(Transfers::kTcp, TcpChannels::kIdPrefix, server->tcp_.get());
    KVC_LOG(INFO) << "transfers: readers connect to port " << server->tcp_->port()
                  << " (transfer_listen " << options.transfer_listen << ")";
  } else {
    server->transfers_.Refuse(
        Transfers::kTcp,
        "this server offers no transfers (ServerConfig.transfer_listen is unset): read over "
        "Fetch");
  }
  if (!options.transfer_nccl_library.empty()) {
    NcclChannelOptions nccl;
    nccl.library = options.transfer_nccl_library;
    if (options.transfer_nccl_receive_bytes_per_tenant > 0) {
      nccl.receive_bytes_per_tenant = options.transfer_nccl_receive_bytes_per_tenant;
    }
    if (options.transfer_nccl_receive_bytes > 0) {
      nccl.receive_bytes = options.transfer_nccl_receive_bytes;
    }
    nccl.on_event = [metrics = server->metrics_.get()](const char* event) {
      metrics->RecordTransferEvent(event);
    };
    absl::StatusOr<std::unique_ptr<NcclChannels>> started =
        NcclChannels::Start(nccl, &server->store_->leases());
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat("transfer_nccl_library: ", started.status().message()));
    }
    server->nccl_ = *std::move(started);
    server->endpoints_.nccl_transfers = server->nccl_->Describe();
    server->transfers_.Offer(Transfers::kNccl, NcclChannels::kIdPrefix, server->nccl_.get());
    KVC_LOG(INFO) << "NCCL transfers of device pools' blocks: " << server->nccl_->Describe();
  } else {
    server->transfers_.Refuse(
        Transfers::kNccl,
        "this server offers no NCCL transfers (ServerConfig.transfer_nccl_library is unset)");
  }
  server->access_ = std::make_unique<AccessControl>(server->auth_.get(), server->limits_.get(),
                                                    server->metrics_.get());
  server->kv_service_ = std::make_unique<KvCacheServiceImpl>(
      server->store_.get(), server->metrics_.get(), server->access_.get(), &server->transfers_,
      &server->endpoints_, server->staging_.get(), server->nccl_.get());
  KvCacheServer* self = server.get();
  server->admin_service_ = std::make_unique<AdminServiceImpl>(
      server->store_.get(), server->metrics_.get(), server->access_.get(), &server->endpoints_,
      [self](bool draining) { self->SetDraining(draining); });

  // grpc.health.v1 (Kubernetes gRPC probes) and server reflection (grpcurl and friends).
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, credentials, &server->port_);
  // Without this, gRPC sets SO_REUSEPORT and a second kvcached on the same port would
  // silently share its traffic instead of failing to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(server->kv_service_.get());
  builder.RegisterService(server->admin_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    server->server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", options.listen,
        "': the address is malformed, in use, or not local; pick another with --listen"));
  }
  const auto colon = options.listen.rfind(':');
  server->address_ = absl::StrCat(options.listen.substr(0, colon), ":", server->port_);
  return server;
}

void KvCacheServer::SetDraining(bool draining) {
  store_->SetDraining(draining);
  metrics_->SetDraining(draining);
  if (server_ != nullptr && server_->GetHealthCheckService() != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(!draining);
  }
}

void KvCacheServer::Shutdown(absl::Duration deadline) {
  if (server_ == nullptr) return;
  SetDraining(true);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + deadline));
}

absl::Status KvCacheServer::ReloadCredentials() { return auth_->Reload(); }

void KvCacheServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace kvc::cachesvc
