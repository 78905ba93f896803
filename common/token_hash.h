// Bearer tokens at rest: kvcached's tokens file holds, per token, a random salt and
// SHA-256(salt || token), never the token. Tokens are random (kvcachectl hash-token makes
// 32 bytes from the OS), so a fast hash suffices: there is no dictionary to guess against,
// and a slow KDF would only cost every RPC. Verification compares in constant time.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvc {

// Lowercase hex of SHA-256(salt || token).
std::string TokenHashHex(absl::string_view salt, absl::string_view token);

// `n` random bytes from the OS (OpenSSL's RAND_bytes). INTERNAL if it fails.
absl::StatusOr<std::string> RandomBytes(int n);

std::string ToHex(absl::string_view bytes);
// INVALID_ARGUMENT for odd length or a non-hex character.
absl::StatusOr<std::string> FromHex(absl::string_view hex);

// Equal strings, in time that depends only on their lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace kvc
