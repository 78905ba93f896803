// kvcachectl's connection to one kvcached: a kvc::client::AdminClient with the TLS and token
// flags applied (client/cli/security_flags.h), and the deadline every call carries
// (--timeout_ms).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvc/client/admin_client.h"

namespace kvc::cli {

// An AdminClient for `target` with the security flags applied; INVALID_ARGUMENT when they do
// not work (an unreadable file, a malformed token). Nothing is sent yet. Each command is one
// call, not retried: --timeout_ms bounds it, and an unreachable target says so at once.
absl::StatusOr<std::unique_ptr<client::AdminClient>> Dial(const std::string& target);

// The call options of every call: the deadline --timeout_ms.
client::CallOptions Call();

}  // namespace kvc::cli
