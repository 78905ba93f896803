// kvcachectl hash-token: the line of kvcached's tokens file for a bearer token, so the
// server stores a salted hash and never the token.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace kvc::cli {

// "tenant role salt-hex sha256-hex" with a fresh random 16-byte salt and the hash
// TokenHashHex(salt, token). `role` is "tenant" or "admin"; `tenant` is 1-64 characters of
// [A-Za-z0-9._-]; `token` is printable ASCII without spaces. INVALID_ARGUMENT otherwise.
absl::StatusOr<std::string> TokensFileLine(const std::string& tenant, const std::string& role,
                                           const std::string& token);

// A new token: 32 random bytes, hex-encoded (what a client sends, and what is hashed).
absl::StatusOr<std::string> GenerateToken();

}  // namespace kvc::cli
