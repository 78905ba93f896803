// Transport security and authentication settings of kvcached (ServerConfig.tls / .auth).
#pragma once

#include <string>
#include <vector>

namespace kvc::cachesvc {

enum class Role { kTenant, kAdmin };

struct TlsOptions {
  std::string cert_file;  // PEM chain; empty = plaintext
  std::string key_file;
  std::string client_ca_file;  // set = request and verify client certificates (mTLS)
  bool require_client_cert = false;
  int reload_interval_seconds = 60;
  bool enabled() const { return !cert_file.empty(); }
};

struct ClientIdentityOption {
  std::string san;  // a subject alternative name of a verified client certificate
  std::string tenant;
  Role role = Role::kTenant;
};

struct AuthOptions {
  std::string tokens_file;  // "tenant role salt-hex sha256-hex" lines
  std::vector<ClientIdentityOption> client_identities;
  int reload_interval_seconds = 10;
  bool enabled() const { return !tokens_file.empty() || !client_identities.empty(); }
};

// Tenant names that come from credentials: [A-Za-z0-9._-], 1-64 characters.
bool IsValidTenantName(const std::string& name);

}  // namespace kvc::cachesvc
