// kvcached configuration: defaults, the text-format config file (kvcache.v1.ServerConfig)
// and byte sizes such as "2GiB".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cachesvc/core/store/kv_store.h"
#include "cachesvc/security/security_options.h"

namespace kvc::cachesvc {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";
  std::string metrics_listen;  // "" = no /metrics endpoint (metrics are still kept)
  KvStoreOptions store;
  int64_t max_message_bytes = int64_t{16} << 20;
  TlsOptions tls;
  AuthOptions auth;
  // Listening beyond loopback without TLS or without authentication is refused unless set.
  bool insecure = false;
  // Same-node reads (local_socket.h): "" = off.
  std::string local_socket;
  std::vector<uint32_t> local_socket_uids;   // the engines' uids
  bool local_socket_allow_same_uid = false;  // admit kvcached's own uid too
  // Bytes of staging regions one tenant may hold open through local_socket, and all tenants
  // together (staging_regions.h).
  int64_t local_staging_bytes_per_tenant = int64_t{4} << 30;
  int64_t local_staging_bytes_total = int64_t{16} << 30;
  // Transfers (cachesvc/transport/tcp_channels.h): "host:port" of the TCP listener; "" = off.
  std::string transfer_listen;
  std::string transfer_advertise_host;  // "" = the host clients reached gRPC at
  // NCCL transfers (nccl_channels.h): the library to load; "" = off.
  std::string transfer_nccl_library;
  bool transfer_nccl_trusted_fabric = false;  // NCCL beside tls
  // Budgets of NCCL receive buffers (NcclChannelOptions); 0 = NcclChannelOptions' default.
  int64_t transfer_nccl_receive_bytes_per_tenant = 0;
  int64_t transfer_nccl_receive_bytes = 0;
};

// One host pool named "default", shaped like the reference model (SmolLM2-135M: 30 layers,
// 3 kv heads, 9 query heads, head_dim 64, f16, RoPE theta 100000), 1 GiB.
ServerOptions DefaultServerOptions();

// Reads a text-format kvcache.v1.ServerConfig. INVALID_ARGUMENT with the parser's line and
// column on syntax errors; NOT_FOUND when the file cannot be read.
absl::StatusOr<ServerOptions> LoadServerConfig(const std::string& path);
absl::StatusOr<ServerOptions> ParseServerConfig(const std::string& text);

// Whether only this machine can reach `listen` ("unix:" sockets, 127.0.0.0/8, ::1,
// localhost).
bool IsLoopback(const std::string& listen);
// FAILED_PRECONDITION for a non-loopback listen address without TLS or without
// authentication, unless options.insecure: KvCacheServer::Start refuses such a config.
absl::Status CheckExposure(const ServerOptions& options);

// "1073741824", "512MiB", "2GiB", "64KiB", "1.5GiB" -> bytes. INVALID_ARGUMENT otherwise.
absl::StatusOr<int64_t> ParseByteSize(const std::string& text);

}  // namespace kvc::cachesvc
