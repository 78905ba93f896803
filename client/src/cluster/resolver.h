// Where the shards of a cluster are: a fixed list of targets, or every address a DNS name
// has now (a Kubernetes headless Service answers one record per ready pod).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvc::client::internal {

// "host:port" (or "[v6]:port") -> the sorted, distinct "ip:port" / "[v6]:port" addresses of
// host. INVALID_ARGUMENT for a malformed name; UNAVAILABLE when resolution fails or is empty.
absl::StatusOr<std::vector<std::string>> ResolveAll(const std::string& dns_name);

}  // namespace kvc::client::internal
