// A lease as the payload of its SendLease carries it (transfer/payload.h): every segment's
// blocks renumbered to their place among its format's blocks in the payload, and where each
// format's blocks lie. The TCP reader (transfer_reader.h) and the NCCL link
// (kvc/client/nccl_link.h) both read received blocks through this.
#pragma once

#include "absl/status/statusor.h"
#include "kvc/client/types.h"
#include "transfer/payload.h"

namespace kvc::client::internal {

struct PayloadPlan {
  Lease lease;  // renumbered
  transfer::PayloadLayout layout;
};

// INTERNAL when a segment's format has no arena in the lease or is not a payload format.
absl::StatusOr<PayloadPlan> PlanPayload(const Lease& lease);

}  // namespace kvc::client::internal
