// The flags kvcachectl and kvc-loadgen share to reach a kvcached that wants TLS or a token:
//   --tls_ca=FILE [--tls_cert=FILE --tls_key=FILE] [--tls_server_name=NAME] [--token_file=FILE]
// The token comes from a file, or from $KVC_TOKEN when --token_file is unset; never from a
// flag value, which any user on the machine could read in `ps`.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "kvc/client/kv_cache_client.h"

namespace kvc::cli {

// Sets options->tls and options->bearer_token from the flags. INVALID_ARGUMENT naming the
// token file when it cannot be read or is empty.
absl::Status ApplySecurityFlags(client::ClientOptions* options);

// The token held in `path` (surrounding whitespace dropped); with an empty path, $KVC_TOKEN,
// or "" when that is unset too.
absl::StatusOr<std::string> LoadToken(const std::string& path);

}  // namespace kvc::cli
