// kvcachectl's connection to one kvcached: the channel with the TLS and token flags applied
// (client/cli/security_flags.h), and the deadline and credentials every call carries. Raw
// channels rather than kvc::client::KvCacheClient because kvcachectl prints the kvcache.v1
// responses themselves (--json).
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvc/client/kv_cache_client.h"

namespace kvc::cli {

// A channel to one target, with the options it was made from (the token is added per call).
struct Conn {
  kvc::client::ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
};

// A channel to `target` with the security flags applied; INVALID_ARGUMENT when they do not
// work (an unreadable file, a malformed token). Nothing is sent yet.
absl::StatusOr<Conn> Dial(const std::string& target);

// Sets the deadline (now + timeout_ms) and the bearer token on a call's context.
void PrepareContext(const Conn& conn, int timeout_ms, grpc::ClientContext* context);

}  // namespace kvc::cli
