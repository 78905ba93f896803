#include "cachesvc/security/authenticator.h"

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/token_hash.h"

namespace kvc::cachesvc {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Identifies a version of the file: a rewrite, a rename over it (Kubernetes Secret volumes
// swap a symlink) or a touch changes it.
std::string FileStamp(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

}  // namespace

absl::StatusOr<std::vector<TokenEntry>> ParseTokensFile(const std::string& text) {
  std::vector<TokenEntry> entries;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens file line ", line_number, ": ", why,
          "; expected 'tenant role salt-hex sha256-hex' (make one with kvcachectl hash-token)"));
    };
    if (fields.size() != 4) return bad(absl::StrCat(fields.size(), " fields"));
    TokenEntry entry;
    entry.tenant = std::string(fields[0]);
    if (!IsValidTenantName(entry.tenant)) {
      return bad("the tenant is not 1-64 characters from [A-Za-z0-9._-]");
    }
    if (fields[1] == "admin") {
      entry.role = Role::kAdmin;
    } else if (fields[1] == "tenant") {
      entry.role = Role::kTenant;
    } else {
      return bad("the role is neither 'tenant' nor 'admin'");
    }
    auto salt = FromHex(fields[2]);
    if (!salt.ok() || salt->size() < 8) return bad("the salt is not at least 8 hex-encoded bytes");
    entry.salt = *std::move(salt);
    auto hash = FromHex(fields[3]);
    if (!hash.ok() || hash->size() != 32) return bad("the hash is not 64 hex digits (SHA-256)");
    entry.hash_hex = ToHex(*hash);  // lowercase, as TokenHashHex makes it
    entries.push_back(std::move(entry));
  }
  return entries;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const AuthOptions& options) {
  std::unique_ptr<Authenticator> auth(new Authenticator(options));
  if (!options.tokens_file.empty()) {
    KVC_RETURN_IF_ERROR(auth->Reload());
    auth->watcher_ = std::thread([a = auth.get()] { a->Watch(); });
  }
  return auth;
}

Authenticator::~Authenticator() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

absl::Status Authenticator::Reload() {
  const std::string& path = options_.tokens_file;
  if (path.empty()) return absl::OkStatus();
  const std::string stamp = FileStamp(path);
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read tokens file '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  auto entries = ParseTokensFile(text.str());
  if (!entries.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", entries.status().message()));
  }
  const size_t count = entries->size();
  {
    kvc::MutexLock lock(&mu_);
    tokens_ = std::make_shared<const std::vector<TokenEntry>>(*std::move(entries));
    verified_.clear();
    file_stamp_ = stamp;
    // Inside the lock: whoever sees the new generation authenticates against the new tokens.
    loads_.fetch_add(1, std::memory_order_acq_rel);
  }
  KVC_LOG(INFO) << "auth: loaded " << count << " tokens from " << path;
  return absl::OkStatus();
}

void Authenticator::Watch() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_cv_.wait_for(lock, std::chrono::seconds(options_.reload_interval_seconds),
                             [this] { return stopping_; })) {
    std::string loaded_stamp;
    {
      kvc::MutexLock l(&mu_);
      loaded_stamp = file_stamp_;
    }
    if (FileStamp(options_.tokens_file) == loaded_stamp) continue;
    if (absl::Status s = Reload(); !s.ok()) {
      KVC_LOG(ERROR) << "auth: the tokens file changed but was not reloaded; the previous "
                     << "tokens stay in force: " << s.message();
      kvc::MutexLock l(&mu_);
      file_stamp_ = FileStamp(options_.tokens_file);  // log once per change, not per poll
    }
  }
}

void Authenticator::Refuse(const grpc::ServerContext& context, const std::string& why) const {
  // At most one line a second: a client hammering with a bad token must not flood the log.
  const int64_t now = NowMs();
  int64_t last = last_refusal_log_ms_.load();
  if (now - last < 1000 || !last_refusal_log_ms_.compare_exchange_strong(last, now)) {
    refusals_unlogged_.fetch_add(1);
    return;
  }
  const int64_t skipped = refusals_unlogged_.exchange(0);
  KVC_LOG(WARNING) << "audit: authentication failed for peer " << context.peer() << ": " << why
                   << (skipped > 0 ? absl::StrCat(" (and ", skipped, " more since the last line)")
                                   : "");
}

absl::StatusOr<Caller> Authenticator::FromToken(const std::string& token) const {
  const std::string key = TokenHashHex("", token);
  std::shared_ptr<const std::vector<TokenEntry>> tokens;
  {
    kvc::MutexLock lock(&mu_);
    if (auto it = verified_.find(key); it != verified_.end()) return it->second;
    tokens = tokens_;
  }
  if (tokens != nullptr) {
    for (const TokenEntry& entry : *tokens) {
      if (!ConstantTimeEquals(TokenHashHex(entry.salt, token), entry.hash_hex)) continue;
      Caller caller{true, entry.tenant, entry.role, "token"};
      kvc::MutexLock lock(&mu_);
      if (tokens_ == tokens) {  // not if a reload replaced the file meanwhile
        if (verified_.size() >= 4096) verified_.clear();
        verified_.emplace(key, caller);
      }
      return caller;
    }
  }
  return absl::UnauthenticatedError("the bearer token is not valid (unknown, revoked or mistyped)");
}

absl::StatusOr<Caller> Authenticator::FromCertificate(const grpc::ServerContext& context) const {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  // gRPC lists a client certificate's SANs only once the certificate was verified against
  // tls.client_ca_file (ParseAuth requires one for client identities).
  if (auth == nullptr || !auth->IsPeerAuthenticated()) {
    return absl::UnauthenticatedError(
        "no credentials: send 'authorization: Bearer <token>' metadata (kvcachectl "
        "--token_file) or a client certificate the server maps to a tenant");
  }
  for (const grpc::string_ref& san : auth->FindPropertyValues("x509_subject_alternative_name")) {
    const std::string name(san.data(), san.size());
    for (const ClientIdentityOption& id : options_.client_identities) {
      if (id.san == name)
        return Caller{true, id.tenant, id.role, absl::StrCat("certificate SAN '", name, "'")};
    }
  }
  return absl::UnauthenticatedError(
      "the client certificate is valid but none of its subject alternative names is mapped "
      "to a tenant (auth.client_identities)");
}

absl::StatusOr<Caller> Authenticator::AuthenticateToken(const std::string& token) const {
  if (!enabled()) return Caller{};
  if (token.empty()) return absl::UnauthenticatedError("no bearer token");
  return FromToken(token);
}

absl::StatusOr<Caller> Authenticator::Authenticate(const grpc::ServerContext& context) const {
  if (!enabled()) return Caller{};
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  absl::StatusOr<Caller> caller;
  if (it != metadata.end()) {
    absl::string_view value(it->second.data(), it->second.size());
    if (!absl::ConsumePrefix(&value, "Bearer ") || value.empty()) {
      caller = absl::UnauthenticatedError("the authorization metadata is not 'Bearer <token>'");
    } else {
      caller = FromToken(std::string(value));
    }
  } else {
    caller = FromCertificate(context);
  }
  if (!caller.ok()) Refuse(context, std::string(caller.status().message()));
  return caller;
}

}  // namespace kvc::cachesvc
