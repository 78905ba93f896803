#include "client/channel/channel.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvc::client::internal {
namespace {

// The whole file; it must look like PEM, since gRPC would otherwise only fail the handshake.
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the TLS ", what, " '", path,
                                                   "': ", std::generic_category().message(errno)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (!absl::StrContains(contents.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TLS ", what, " '", path, "' is not PEM (no -----BEGIN line)"));
  }
  return contents.str();
}

absl::Status CheckToken(const std::string& token) {
  for (const char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "bearer_token must be printable ASCII without spaces (a newline from the token file?)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const ClientTlsOptions& tls) {
  if (tls.ca_file.empty()) {
    if (!tls.cert_file.empty() || !tls.key_file.empty() || !tls.server_name.empty()) {
      return absl::InvalidArgumentError(
          "TLS client certificate, key or server name given without the CA file (tls.ca_file, "
          "--tls_ca) that kvcached's certificate is checked against");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate needs its key and the key its certificate (tls.cert_file and "
        "tls.key_file, --tls_cert and --tls_key)");
  }
  grpc::SslCredentialsOptions ssl;
  auto ca = ReadPem(tls.ca_file, "CA file");
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *std::move(ca);
  if (!tls.cert_file.empty()) {
    auto cert = ReadPem(tls.cert_file, "client certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(tls.key_file, "client key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const ClientOptions& options) {
  if (absl::Status status = CheckToken(options.bearer_token); !status.ok()) return status;
  auto credentials = Credentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  if (!options.tls.server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls.server_name);
  }
  if (options.max_reconnect_backoff > absl::ZeroDuration()) {
    // gRPC's default grows to 120 s: a restarted shard would wait that long to be dialled.
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(options.max_reconnect_backoff));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ms);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(ms, 100));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::min(ms, 100));
  }
  return grpc::CreateCustomChannel(options.target, *credentials, args);
}

void AddCallCredentials(const ClientOptions& options, grpc::ClientContext* context) {
  if (!options.bearer_token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options.bearer_token));
  }
}

}  // namespace kvc::client::internal
