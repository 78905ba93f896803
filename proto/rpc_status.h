// The only conversion between absl::Status and grpc::Status: same numeric code (Abseil
// and gRPC share the canonical code table), same message.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvc
