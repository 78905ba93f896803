#include "client/cli/hash_token.h"

#include "absl/strings/str_cat.h"
#include "common/token_hash.h"

namespace kvc::cli {
namespace {

constexpr int kSaltBytes = 16;
constexpr int kTokenBytes = 32;

bool ValidTenant(const std::string& tenant) {
  if (tenant.empty() || tenant.size() > 64) return false;
  for (const char c : tenant) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> TokensFileLine(const std::string& tenant, const std::string& role,
                                           const std::string& token) {
  if (!ValidTenant(tenant)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tenant='", tenant, "' must be 1-64 characters of letters, digits, '.', '_', '-'"));
  }
  if (role != "tenant" && role != "admin") {
    return absl::InvalidArgumentError(
        absl::StrCat("--role='", role, "' must be 'tenant' or 'admin'"));
  }
  if (token.empty()) {
    return absl::InvalidArgumentError(
        "no token on stdin; pipe one in, or pass --generate to make one");
  }
  for (const char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "the token must be printable ASCII without spaces (it travels as an HTTP/2 header)");
    }
  }
  auto salt = RandomBytes(kSaltBytes);
  if (!salt.ok()) return salt.status();
  return absl::StrCat(tenant, " ", role, " ", ToHex(*salt), " ", TokenHashHex(*salt, token));
}

absl::StatusOr<std::string> GenerateToken() {
  auto bytes = RandomBytes(kTokenBytes);
  if (!bytes.ok()) return bytes.status();
  return ToHex(*bytes);
}

}  // namespace kvc::cli
