#include "client/cli/security_flags.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle kvcached's certificate must chain to; set = TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mTLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name kvcached's certificate must carry, when it is not the --target host");
ABSL_FLAG(std::string, token_file, "",
          "file holding the bearer token (default: $KVC_TOKEN; never pass a token as a flag)");

namespace kvc::cli {

absl::StatusOr<std::string> LoadToken(const std::string& path) {
  if (path.empty()) {
    const char* env = std::getenv("KVC_TOKEN");
    return std::string(absl::StripAsciiWhitespace(env != nullptr ? env : ""));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read --token_file '", path,
                                                   "': ", std::generic_category().message(errno)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(contents.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--token_file '", path, "' is empty"));
  }
  return token;
}

absl::Status ApplySecurityFlags(client::ClientOptions* options) {
  options->tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  options->tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options->tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options->tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  auto token = LoadToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) return token.status();
  options->bearer_token = *std::move(token);
  return absl::OkStatus();
}

}  // namespace kvc::cli
