// KvCacheServer: a running kvcached — the KvStore, both gRPC services and the listener.
// Used by main.cc and, in-process on 127.0.0.1:0, by the tests.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cachesvc/core/store/kv_store.h"
#include "cachesvc/metrics/metrics.h"
#include "cachesvc/rpc/endpoints.h"
#include "cachesvc/server/server_config.h"
#include "cachesvc/transport/transfers.h"

namespace grpc {
class Server;
}

namespace kvc::cachesvc {

class KvCacheServiceImpl;
class AdminServiceImpl;
class AccessControl;
class Authenticator;
class CallLimits;
class LocalSocket;
class StagingRegions;
class NcclChannels;
class TcpChannels;

class KvCacheServer {
 public:
  // Builds the pools and starts listening. UNAVAILABLE if the address cannot be bound;
  // FAILED_PRECONDITION for a non-loopback address without TLS and authentication (unless
  // options.insecure); the tokens file's NOT_FOUND / INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<KvCacheServer>> Start(const ServerOptions& options);
  KvCacheServer(const KvCacheServer&) = delete;
  KvCacheServer& operator=(const KvCacheServer&) = delete;
  ~KvCacheServer();

  // "host:port" with the port actually bound (useful with port 0).
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  KvStore* store() const { return store_.get(); }
  Metrics* metrics() const { return metrics_.get(); }
  // "host:port" of /metrics, or "" when not served.
  const std::string& metrics_address() const { return metrics_->address(); }

  // Draining: no new sequences (UNAVAILABLE), health NOT_SERVING, kvc_draining 1. Existing
  // sequences keep working. Thread-safe.
  void SetDraining(bool draining);

  // Drains, stops accepting calls, lets in-flight calls finish until `deadline`, then
  // cancels them.
  void Shutdown(absl::Duration deadline);
  // Re-reads the tokens file now (SIGHUP); on error the previous tokens stay in force.
  absl::Status ReloadCredentials();
  Authenticator* authenticator() const { return auth_.get(); }
  // The data paths beside gRPC, as clients are told about them.
  const Endpoints& endpoints() const { return endpoints_; }

  // Blocks until the server has shut down.
  void Wait();

 private:
  KvCacheServer();

  std::unique_ptr<KvStore> store_;
  // Same-node writers' staging regions (with local_socket only): before the socket and the
  // service that read them, so destroyed after both.
  std::unique_ptr<StagingRegions> staging_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<CallLimits> limits_;
  std::unique_ptr<AccessControl> access_;
  // Transfer channels (with transfer_listen / transfer_nccl_library only) and the kinds
  // offered: before the service that sends on them, so destroyed after it (and after
  // grpc::Server, whose calls may be sending).
  std::unique_ptr<TcpChannels> tcp_;
  std::unique_ptr<NcclChannels> nccl_;
  Transfers transfers_;
  // What GetServerInfo and leases tell about the data paths; filled before serving.
  Endpoints endpoints_;
  std::unique_ptr<KvCacheServiceImpl> kv_service_;
  std::unique_ptr<AdminServiceImpl> admin_service_;
  std::unique_ptr<grpc::Server> server_;
  // Declared last: destroyed first, it hands out the store's arenas and counts in metrics_.
  std::unique_ptr<LocalSocket> local_socket_;
  std::string address_;
  int port_ = 0;
};

}  // namespace kvc::cachesvc
