// How kvc::client and kvcachectl reach kvcached: the channel for a ClientOptions (plaintext
// or TLS) and the bearer token on each call. gRPC types, so not part of the public headers.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kvc/client/kv_cache_client.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace kvc::client::internal {

// A channel to options.target with options.max_message_bytes both ways: TLS when
// options.tls.ca_file is set (reading the CA, certificate and key files now), else plaintext.
// INVALID_ARGUMENT naming the file when one is unreadable or not PEM, or when the TLS options
// or the bearer token do not fit together.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const ClientOptions& options);

// Adds "authorization: Bearer <token>" when options.bearer_token is set. Call on every
// ClientContext, streams included, before the call starts.
void AddCallCredentials(const ClientOptions& options, grpc::ClientContext* context);

}  // namespace kvc::client::internal
