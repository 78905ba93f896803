// Authenticator: who is calling. With authentication configured (ServerConfig.auth), every
// KvCacheService/AdminService call must carry a bearer token from the tokens file
// ("authorization: Bearer <token>") or a verified TLS client certificate whose SAN is listed
// in auth.client_identities; the caller's tenant and role come from that credential, never
// from a request field. Without it, every caller is the anonymous, unauthenticated caller
// and the service behaves as before security existed (a local developer setup).
//
// The tokens file holds salted SHA-256 hashes (common/token_hash.h), re-read when it
// changes (polled every reload_interval_seconds) or on Reload() (SIGHUP); a file that no
// longer parses keeps the previous tokens in force and logs why. Failures are logged
// (rate-limited) with the peer address and reason, never the token.
#pragma once

#include <grpcpp/server_context.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cachesvc/security/security_options.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

struct Caller {
  bool authenticated = false;  // false: authentication is off (no tenant, no limits by role)
  std::string tenant;
  Role role = Role::kTenant;
  std::string credential;  // for audit lines: "token", "certificate SAN '...'"
  bool admin() const { return !authenticated || role == Role::kAdmin; }
};

struct TokenEntry {
  std::string tenant;
  Role role = Role::kTenant;
  std::string salt;      // bytes
  std::string hash_hex;  // SHA-256(salt || token), lowercase hex
};

// Parses a tokens file's text: lines "tenant role salt-hex sha256-hex", '#' comments, blank
// lines. INVALID_ARGUMENT naming the line for anything else.
absl::StatusOr<std::vector<TokenEntry>> ParseTokensFile(const std::string& text);

class Authenticator {
 public:
  // Loads the tokens file (NOT_FOUND / INVALID_ARGUMENT naming it) and starts watching it.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const AuthOptions& options);
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;
  ~Authenticator();

  bool enabled() const { return options_.enabled(); }
  // The caller of `context`, or UNAUTHENTICATED (with what to send) when authentication is
  // on and the call has no valid credential.
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContext& context) const;
  // The caller a bearer token names, checked exactly as on a call (for the local socket,
  // which has no gRPC metadata). With authentication off: the anonymous caller.
  absl::StatusOr<Caller> AuthenticateToken(const std::string& token) const;
  // Re-reads the tokens file now. On error the previous tokens stay in force.
  absl::Status Reload();
  // How many times the tokens file was (re)loaded successfully; for tests and logs.
  int64_t loads() const { return loads_.load(); }
  // Moves on every successful reload, together with the tokens (under the same lock), so a
  // call that stays open re-authenticates only when it moved: one atomic load per message.
  int64_t generation() const { return loads_.load(std::memory_order_acquire); }

 private:
  explicit Authenticator(const AuthOptions& options) : options_(options) {}
  absl::StatusOr<Caller> FromToken(const std::string& token) const;
  absl::StatusOr<Caller> FromCertificate(const grpc::ServerContext& context) const;
  void Refuse(const grpc::ServerContext& context, const std::string& why) const;
  void Watch();

  const AuthOptions options_;
  mutable kvc::Mutex mu_;
  std::shared_ptr<const std::vector<TokenEntry>> tokens_ ABSL_GUARDED_BY(mu_);
  // SHA-256(token) -> the entry it matched: one hash per call instead of one per entry.
  // Cleared on every reload, so a removed token stops working at once.
  mutable absl::flat_hash_map<std::string, Caller> verified_ ABSL_GUARDED_BY(mu_);
  std::string file_stamp_ ABSL_GUARDED_BY(mu_);  // inode, size, mtime of the loaded file
  std::atomic<int64_t> loads_{0};
  mutable std::atomic<int64_t> last_refusal_log_ms_{0};
  mutable std::atomic<int64_t> refusals_unlogged_{0};

  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  std::thread watcher_;
};

}  // namespace kvc::cachesvc
