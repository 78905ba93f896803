// kvcached: the KV-cache service. Wiring only: flags, config, signals.
//
//   kvcached                         one default host pool on 127.0.0.1:50051
//   kvcached --listen=0.0.0.0:50051 --capacity=8GiB
//   kvcached --config=/etc/kvcached/config.textproto
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cachesvc/server/server.h"
#include "common/logging.h"
#include "kvc/kernels/dtype.h"

ABSL_FLAG(std::string, listen, "",
          "host:port to serve on (default 127.0.0.1:50051, or the config's)");
ABSL_FLAG(std::string, config, "", "text-format kvcache.v1.ServerConfig file (pools, listen)");
ABSL_FLAG(std::string, capacity, "",
          "block memory of the default pool, e.g. 512MiB or 8GiB (without --config; default 1GiB)");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port serving Prometheus /metrics (default 127.0.0.1:9464, or the config's; "
          "port 0 = any free port; 'off' = none)");
ABSL_FLAG(std::string, shard, "",
          "this server's name in a cluster of shards (a DNS label; Kubernetes: the pod name); "
          "overrides the config's shard.name. Set: ids are <shard>:<incarnation>:<id>");
ABSL_FLAG(std::string, local_socket, "",
          "unix socket for same-node readers and staged appends; overrides the config's "
          "local_socket (Kubernetes: one per pod, e.g. /run/kvcached/$(POD_NAME).sock)");
ABSL_FLAG(std::vector<std::string>, local_socket_uids, {},
          "uids (comma-separated) admitted on local_socket; overrides the config's");
ABSL_FLAG(bool, local_socket_allow_same_uid, false,
          "admit kvcached's own uid on local_socket (every process of that uid is then trusted "
          "with every tenant's KV); or the config's local_socket_allow_same_uid");
ABSL_FLAG(std::string, transfer_listen, "",
          "host:port of the TCP listener that sends leased blocks to readers on other nodes "
          "(OpenTransfer; port 0 = any free one); overrides the config's transfer_listen. "
          "Under the config's tls it speaks TLS; every frame carries a MAC");
ABSL_FLAG(std::string, transfer_nccl_library, "",
          "the NCCL library (e.g. libnccl.so.2) that sends device pools' leased blocks to "
          "readers on other GPUs (OpenTransfer kind NCCL); overrides the config's "
          "transfer_nccl_library. Carries KV in the clear: beside tls only with "
          "transfer_nccl_trusted_fabric");
ABSL_FLAG(int32_t, shutdown_grace_seconds, 10,
          "on SIGTERM/SIGINT, how long in-flight calls may take to finish");

namespace {

using kvc::cachesvc::KvCacheServer;
using kvc::cachesvc::ServerOptions;

int Fail(const std::string& message) {
  KVC_LOG(ERROR) << message;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("kvcached: the kvcache KV-cache service (see README.md)");
  absl::ParseCommandLine(argc, argv);

  ServerOptions options = kvc::cachesvc::DefaultServerOptions();
  const std::string config_path = absl::GetFlag(FLAGS_config);
  if (!config_path.empty()) {
    if (!absl::GetFlag(FLAGS_capacity).empty()) {
      return Fail("--capacity applies to the default pool only; set capacity_bytes in --config");
    }
    auto loaded = kvc::cachesvc::LoadServerConfig(config_path);
    if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
    options = *loaded;
  } else if (!absl::GetFlag(FLAGS_capacity).empty()) {
    auto bytes = kvc::cachesvc::ParseByteSize(absl::GetFlag(FLAGS_capacity));
    if (!bytes.ok()) return Fail(absl::StrCat("--capacity: ", bytes.status().message()));
    options.store.pools.front().capacity_bytes = *bytes;
  }
  if (!absl::GetFlag(FLAGS_listen).empty()) options.listen = absl::GetFlag(FLAGS_listen);
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  } else if (options.metrics_listen.empty()) {
    options.metrics_listen = "127.0.0.1:9464";
  }
  if (options.metrics_listen == "off") options.metrics_listen.clear();
  if (!absl::GetFlag(FLAGS_shard).empty()) options.store.shard_name = absl::GetFlag(FLAGS_shard);
  if (!absl::GetFlag(FLAGS_local_socket).empty()) {
    options.local_socket = absl::GetFlag(FLAGS_local_socket);
  }
  if (!absl::GetFlag(FLAGS_local_socket_uids).empty()) {
    options.local_socket_uids.clear();
    for (const std::string& uid : absl::GetFlag(FLAGS_local_socket_uids)) {
      uint32_t n = 0;
      if (!absl::SimpleAtoi(uid, &n)) {
        return Fail(absl::StrCat("--local_socket_uids: '", uid.substr(0, 32), "' is not a uid"));
      }
      options.local_socket_uids.push_back(n);
    }
  }
  if (absl::GetFlag(FLAGS_local_socket_allow_same_uid)) options.local_socket_allow_same_uid = true;
  if (!absl::GetFlag(FLAGS_transfer_listen).empty()) {
    options.transfer_listen = absl::GetFlag(FLAGS_transfer_listen);
  }
  if (!absl::GetFlag(FLAGS_transfer_nccl_library).empty()) {
    options.transfer_nccl_library = absl::GetFlag(FLAGS_transfer_nccl_library);
  }

  // Block the signals before gRPC starts its threads, so only sigwait sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = KvCacheServer::Start(options);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  for (const auto& pool : (*server)->store()->stats().ListPools()) {
    const auto& g = pool.options.geometry;
    KVC_LOG(INFO) << "pool '" << pool.options.name << "' on " << pool.options.device << ": "
                  << g.num_layers << " layers x " << g.num_kv_heads << " kv heads ("
                  << g.num_query_heads << " query heads) x head_dim " << g.head_dim << ", "
                  << kvc::kernels::DTypeName(g.dtype) << ", " << g.block_tokens << " tokens/block, "
                  << pool.total_blocks << " blocks of " << pool.block_bytes
                  << " bytes = " << pool.options.capacity_bytes << " bytes capacity";
  }
  const kvc::cachesvc::ShardIdentity& shard = (*server)->store()->stats().shard();
  if (shard.clustered()) {
    KVC_LOG(INFO) << "cluster shard '" << shard.name() << "', incarnation " << shard.incarnation()
                  << ", placement weight " << shard.weight();
  }
  if (!(*server)->metrics_address().empty()) {
    KVC_LOG(INFO) << "metrics on http://" << (*server)->metrics_address() << "/metrics";
  }
  KVC_LOG(INFO) << "kvcached listening on " << (*server)->address() << " ("
                << (options.tls.enabled()
                        ? (options.tls.client_ca_file.empty() ? "TLS" : "TLS, client certificates")
                        : "plaintext")
                << "; authentication "
                << (options.auth.enabled()
                        ? absl::StrCat(options.auth.tokens_file.empty() ? "" : "tokens file",
                                       options.auth.tokens_file.empty() ||
                                               options.auth.client_identities.empty()
                                           ? ""
                                           : " + ",
                                       options.auth.client_identities.empty()
                                           ? ""
                                           : absl::StrCat(options.auth.client_identities.size(),
                                                          " certificate identities"))
                        : std::string("off"))
                << ")";

  int signal_number = 0;
  // SIGHUP re-reads the tokens file (TLS files are re-read on their own interval).
  while (sigwait(&signals, &signal_number) == 0 && signal_number == SIGHUP) {
    const absl::Status reloaded = (*server)->ReloadCredentials();
    if (reloaded.ok()) {
      KVC_LOG(INFO) << "SIGHUP: credentials reloaded";
    } else {
      KVC_LOG(ERROR) << "SIGHUP: credentials not reloaded; the previous ones stay in force: "
                     << reloaded.message();
    }
  }
  const int grace = absl::GetFlag(FLAGS_shutdown_grace_seconds);
  KVC_LOG(INFO) << "received signal " << signal_number << "; shutting down (grace " << grace
                << " s)";
  // Draining first: no new sequences, health NOT_SERVING so load balancers move away,
  // in-flight calls finish within the grace period.
  (*server)->Shutdown(absl::Seconds(grace));
  (*server)->Wait();
  KVC_LOG(INFO) << "kvcached stopped";
  return 0;
}
