#include "client/cli/conn.h"

#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/cli/flags.h"
#include "client/cli/security_flags.h"

namespace kvc::cli {

absl::StatusOr<std::unique_ptr<client::AdminClient>> Dial(const std::string& target) {
  client::ClientOptions options;
  options.target = target;
  options.max_attempts = 1;
  if (absl::Status status = ApplySecurityFlags(&options); !status.ok()) return status;
  return client::AdminClient::Connect(options);
}

client::CallOptions Call() {
  return client::CallOptions{absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms))};
}

}  // namespace kvc::cli
