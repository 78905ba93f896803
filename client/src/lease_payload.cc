#include "client/src/lease_payload.h"

#include <array>

namespace kvc::client::internal {

absl::StatusOr<PayloadPlan> PlanPayload(const Lease& lease) {
  PayloadPlan plan;
  plan.lease = lease;
  transfer::PayloadNumbering numbering;
  for (LeaseLane& lane : plan.lease.lanes) {
    for (LeaseSegment& seg : lane.segments) {
      const int f = static_cast<int>(seg.format);
      if (lease.arena(seg.format) == nullptr) {
        return absl::InternalError("the lease names no arena for a segment");
      }
      for (int32_t& block : seg.blocks) {
        const absl::StatusOr<int64_t> index = numbering.Next(f);
        if (!index.ok()) return absl::InternalError(index.status().message());
        block = static_cast<int32_t>(*index);
      }
    }
  }
  std::array<int64_t, transfer::kMaxFormats> blocks{};
  std::array<int64_t, transfer::kMaxFormats> block_bytes{};
  for (int f = 1; f < transfer::kMaxFormats; ++f) {
    blocks[static_cast<size_t>(f)] = numbering.count(f);
    if (blocks[static_cast<size_t>(f)] > 0) {
      block_bytes[static_cast<size_t>(f)] = lease.arena(static_cast<StorageFormat>(f))->block_bytes;
    }
  }
  absl::StatusOr<transfer::PayloadLayout> layout =
      transfer::PayloadLayout::Make(blocks, block_bytes);
  if (!layout.ok()) return absl::InternalError(layout.status().message());
  plan.layout = *layout;
  return plan;
}

}  // namespace kvc::client::internal
