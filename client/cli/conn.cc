#include "client/cli/conn.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "client/channel/channel.h"
#include "client/cli/security_flags.h"

namespace kvc::cli {

absl::StatusOr<Conn> Dial(const std::string& target) {
  Conn conn;
  conn.options.target = target;
  if (absl::Status status = ApplySecurityFlags(&conn.options); !status.ok()) {
    return status;
  }
  auto channel = kvc::client::internal::CreateChannel(conn.options);
  if (!channel.ok()) return channel.status();
  conn.channel = *std::move(channel);
  return conn;
}

void PrepareContext(const Conn& conn, int timeout_ms, grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  kvc::client::internal::AddCallCredentials(conn.options, context);
}

}  // namespace kvc::cli
