#include "cachesvc/server/server_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cachesvc/core/base/shard_identity.h"
#include "cachesvc/rpc/proto_convert.h"
#include "common/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "kvcache/v1/config.pb.h"

namespace kvc::cachesvc {

ServerOptions DefaultServerOptions() {
  ServerOptions options;
  PoolOptions pool;
  pool.name = "default";
  pool.capacity_bytes = int64_t{1} << 30;
  pool.geometry.num_layers = 30;
  pool.geometry.num_kv_heads = 3;
  pool.geometry.num_query_heads = 9;
  pool.geometry.head_dim = 64;
  pool.geometry.block_tokens = 16;
  pool.geometry.dtype = DType::kF16;
  pool.geometry.rope.enabled = true;
  pool.geometry.rope.theta = 100000;
  options.store.pools.push_back(pool);
  return options;
}

namespace {

// Collects parser errors into one message a person can act on.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (!errors_.empty()) errors_ += "; ";
    absl::StrAppend(&errors_, "line ", line + 1, " column ", column + 1, ": ", message);
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string errors_;
};

absl::Status CheckInterval(const char* what, int32_t seconds) {
  if (seconds < 0 || seconds > 86400) {
    return absl::InvalidArgumentError(
        absl::StrCat("config ", what, " is ", seconds, "; expected 1 .. 86400 (0 = default)"));
  }
  return absl::OkStatus();
}

absl::Status ParseTls(const kvcache::v1::TlsConfig& tls, TlsOptions* out) {
  out->cert_file = tls.cert_file();
  out->key_file = tls.key_file();
  out->client_ca_file = tls.client_ca_file();
  out->require_client_cert = tls.require_client_cert();
  KVC_RETURN_IF_ERROR(CheckInterval("tls.reload_interval_seconds", tls.reload_interval_seconds()));
  if (tls.reload_interval_seconds() > 0)
    out->reload_interval_seconds = tls.reload_interval_seconds();
  if (out->cert_file.empty() != out->key_file.empty()) {
    return absl::InvalidArgumentError(
        "config tls needs both cert_file and key_file (the certificate and its private key)");
  }
  if (out->cert_file.empty() && (!out->client_ca_file.empty() || out->require_client_cert)) {
    return absl::InvalidArgumentError(
        "config tls.client_ca_file / require_client_cert need tls.cert_file and key_file");
  }
  if (out->require_client_cert && out->client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "config tls.require_client_cert needs tls.client_ca_file (the CAs to verify them with)");
  }
  return absl::OkStatus();
}

absl::Status ParseAuth(const kvcache::v1::AuthConfig& auth, const TlsOptions& tls,
                       AuthOptions* out) {
  out->tokens_file = auth.tokens_file();
  KVC_RETURN_IF_ERROR(
      CheckInterval("auth.reload_interval_seconds", auth.reload_interval_seconds()));
  if (auth.reload_interval_seconds() > 0) {
    out->reload_interval_seconds = auth.reload_interval_seconds();
  }
  for (const auto& id : auth.client_identities()) {
    if (id.san().empty()) {
      return absl::InvalidArgumentError("config auth.client_identities entry has an empty san");
    }
    if (!IsValidTenantName(id.tenant())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config auth.client_identities san '", id.san().substr(0, 64), "' has tenant '",
          id.tenant().substr(0, 64), "'; use 1-64 characters from [A-Za-z0-9._-]"));
    }
    for (const auto& other : out->client_identities) {
      if (other.san == id.san()) {
        return absl::InvalidArgumentError(absl::StrCat("config auth.client_identities lists san '",
                                                       id.san().substr(0, 64), "' twice"));
      }
    }
    if (!kvcache::v1::Role_IsValid(id.role())) {
      return absl::InvalidArgumentError(
          absl::StrCat("config auth.client_identities san '", id.san().substr(0, 64), "' has role ",
                       static_cast<int>(id.role()), "; expected ROLE_TENANT or ROLE_ADMIN"));
    }
    out->client_identities.push_back(
        {id.san(), id.tenant(),
         id.role() == kvcache::v1::ROLE_ADMIN ? Role::kAdmin : Role::kTenant});
  }
  if (!out->client_identities.empty() && tls.client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "config auth.client_identities need tls.client_ca_file: client certificates are only "
        "trusted once verified");
  }
  return absl::OkStatus();
}

absl::Status ParseQuotas(const kvcache::v1::ServerConfig& config, std::vector<TenantQuota>* out) {
  for (const auto& q : config.quotas()) {
    if (q.tenant() != "*" && !IsValidTenantName(q.tenant())) {
      return absl::InvalidArgumentError(
          absl::StrCat("config quotas entry has tenant '", q.tenant().substr(0, 64),
                       "'; use \"*\" or 1-64 characters from [A-Za-z0-9._-]"));
    }
    if (q.max_bytes_per_pool() < 0 || q.max_sequences() < 0 || q.max_streams() < 0 ||
        q.max_compute_calls() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("config quotas for tenant '", q.tenant(),
                                                     "' has a negative limit (0 = unlimited)"));
    }
    for (const TenantQuota& other : *out) {
      if (other.tenant == q.tenant()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config quotas lists tenant '", q.tenant(), "' twice"));
      }
    }
    out->push_back({q.tenant(), q.max_bytes_per_pool(), q.max_sequences(), q.max_streams(),
                    q.max_compute_calls()});
  }
  return absl::OkStatus();
}

absl::Status ParseLeases(const kvcache::v1::LeaseConfig& config, LeaseLimits* out) {
  const std::pair<const char*, int64_t> fields[] = {{"default_ttl_ms", config.default_ttl_ms()},
                                                    {"max_ttl_ms", config.max_ttl_ms()},
                                                    {"max_per_tenant", config.max_per_tenant()},
                                                    {"max_lifetime_ms", config.max_lifetime_ms()}};
  for (const auto& [name, value] : fields) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("config leases.", name, " is ", value, "; expected > 0 (0 = default)"));
    }
  }
  if (config.default_ttl_ms() > 0) out->default_ttl_ms = config.default_ttl_ms();
  if (config.max_ttl_ms() > 0) out->max_ttl_ms = config.max_ttl_ms();
  if (config.max_per_tenant() > 0) out->max_per_scope = config.max_per_tenant();
  if (config.max_lifetime_ms() > 0) out->max_lifetime_ms = config.max_lifetime_ms();
  if (out->default_ttl_ms > out->max_ttl_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("config leases.default_ttl_ms (", out->default_ttl_ms,
                     ") is above leases.max_ttl_ms (", out->max_ttl_ms, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsValidTenantName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::StatusOr<ServerOptions> ParseServerConfig(const std::string& text) {
  kvcache::v1::ServerConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config is not a valid ServerConfig: ", errors.errors()));
  }
  ServerOptions options;
  if (!config.listen().empty()) options.listen = config.listen();
  options.metrics_listen = config.metrics_listen();
  if (config.max_message_bytes() < 0) {
    return absl::InvalidArgumentError("config max_message_bytes must be >= 0");
  }
  if (config.max_message_bytes() > 0) options.max_message_bytes = config.max_message_bytes();
  if (config.max_sequences() < 0) {
    return absl::InvalidArgumentError("config max_sequences must be >= 0");
  }
  if (config.max_sequences() > 0) options.store.max_sequences = config.max_sequences();
  if (config.verify_shared_reads_every() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config verify_shared_reads_every is ", config.verify_shared_reads_every(),
                     "; expected 0 (the default, 64) or N >= 1 (1 in N reads)"));
  }
  options.local_socket = config.local_socket();
  options.local_socket_uids.assign(config.local_socket_uids().begin(),
                                   config.local_socket_uids().end());
  options.local_socket_allow_same_uid = config.local_socket_allow_same_uid();
  if (config.local_staging_bytes_per_tenant() < 0 || config.local_staging_bytes_total() < 0) {
    return absl::InvalidArgumentError(
        "config local_staging_bytes_per_tenant and local_staging_bytes_total must be >= 0 (0 = "
        "the default)");
  }
  if (config.local_staging_bytes_per_tenant() > 0) {
    options.local_staging_bytes_per_tenant = config.local_staging_bytes_per_tenant();
  }
  if (config.local_staging_bytes_total() > 0) {
    options.local_staging_bytes_total = config.local_staging_bytes_total();
  }
  options.transfer_listen = config.transfer_listen();
  options.transfer_advertise_host = config.transfer_advertise_host();
  options.transfer_nccl_library = config.transfer_nccl_library();
  options.transfer_nccl_trusted_fabric = config.transfer_nccl_trusted_fabric();
  if (config.transfer_nccl_receive_bytes_per_tenant() < 0 ||
      config.transfer_nccl_receive_bytes() < 0) {
    return absl::InvalidArgumentError(
        "config transfer_nccl_receive_bytes_per_tenant and transfer_nccl_receive_bytes must be "
        ">= 0 (0 = the default: 1 GiB and 4 GiB)");
  }
  options.transfer_nccl_receive_bytes_per_tenant = config.transfer_nccl_receive_bytes_per_tenant();
  options.transfer_nccl_receive_bytes = config.transfer_nccl_receive_bytes();
  if (config.verify_shared_reads_every() > 0) {
    options.store.verify_shared_reads_every = config.verify_shared_reads_every();
  }
  if (config.pools().empty()) {
    return absl::InvalidArgumentError("config has no pools: add at least one `pools { ... }`");
  }
  for (const auto& pool : config.pools()) {
    KVC_ASSIGN_OR_RETURN(PoolOptions p, FromProto(pool));
    options.store.pools.push_back(p);
  }
  KVC_RETURN_IF_ERROR(ParseTls(config.tls(), &options.tls));
  KVC_RETURN_IF_ERROR(ParseAuth(config.auth(), options.tls, &options.auth));
  KVC_RETURN_IF_ERROR(ParseQuotas(config, &options.store.quotas));
  KVC_RETURN_IF_ERROR(ParseLeases(config.leases(), &options.store.leases));
  options.insecure = config.insecure();
  options.store.shard_name = config.shard().name();
  options.store.shard_weight = config.shard().weight();
  if (const auto shard = ShardIdentity::Create(config.shard().name(), config.shard().weight());
      !shard.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config shard: ", shard.status().message()));
  }
  return options;
}

// Whether only this machine can reach `listen` ("unix:" sockets, 127.0.0.0/8, ::1,
// localhost). Anything else — 0.0.0.0, a pod IP, a hostname — is reachable from the network.
bool IsLoopback(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:")) return true;
  std::string host = listen.substr(0, listen.rfind(':'));
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

// A non-loopback listener needs TLS (tokens and KV cross the network) and authentication
// (anyone on the network could call), unless the operator opted out in so many words.
absl::Status CheckExposure(const ServerOptions& options) {
  if (IsLoopback(options.listen)) return absl::OkStatus();
  std::string missing;
  if (!options.tls.enabled()) missing = "TLS (tls { cert_file key_file })";
  if (!options.auth.enabled()) {
    if (!missing.empty()) missing += " and ";
    missing += "authentication (auth { tokens_file } or client_identities)";
  }
  if (missing.empty()) return absl::OkStatus();
  if (!options.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on '", options.listen, "' without ", missing,
        ": anyone who reaches the port could read and change every tenant's KV. Configure "
        "them, listen on 127.0.0.1, or set `insecure: true` in the config to accept the risk"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ServerOptions> LoadServerConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  auto options = ParseServerConfig(text.str());
  if (!options.ok()) {
    return absl::Status(options.status().code(),
                        absl::StrCat(path, ": ", options.status().message()));
  }
  return options;
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  absl::string_view s(text.data(), text.size());
  struct Unit {
    const char* suffix;
    double factor;
  };
  static constexpr Unit kUnits[] = {{"TiB", 1099511627776.0},
                                    {"GiB", 1073741824.0},
                                    {"MiB", 1048576.0},
                                    {"KiB", 1024.0},
                                    {"TB", 1e12},
                                    {"GB", 1e9},
                                    {"MB", 1e6},
                                    {"KB", 1e3},
                                    {"B", 1.0}};
  double factor = 1;
  for (const Unit& unit : kUnits) {
    if (absl::ConsumeSuffix(&s, unit.suffix)) {
      factor = unit.factor;
      break;
    }
  }
  double value = 0;
  if (s.empty() || !absl::SimpleAtod(s, &value) || !(value >= 0) || value * factor > 9.2e18) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a byte size; use e.g. 1073741824, 512MiB or 2GiB"));
  }
  return static_cast<int64_t>(std::llround(value * factor));
}

}  // namespace kvc::cachesvc
