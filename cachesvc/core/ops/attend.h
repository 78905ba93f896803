// Attend: decode attention of n query tokens of one layer over every token stored for that
// layer, computed by the paged decode-attention kernel in the stored format next to the
// memory. Each tier of a lane is attended separately and the parts merge exactly by their
// log-sum-exp. Every call adds its attention weights to the tokens' H2O scores, committed
// only when the whole call succeeded.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "cachesvc/core/base/requests.h"
#include "cachesvc/core/sequence/sequence.h"

namespace kvc::cachesvc {

inline constexpr int64_t kMaxAttendQueries = 4096;

// Shape checks against the pool (no lock needed); returns the queries' dtype.
absl::StatusOr<DType> ValidateAttend(const AttendParams& params, const PoolOptions& pool);

// FAILED_PRECONDITION for a query position before the layer's last token; RESOURCE_EXHAUSTED
// (before any work) when the response would exceed `max_response_bytes`.
absl::StatusOr<AttendResult> AttendLocked(Sequence& seq, const AttendParams& params, DType dtype,
                                          int64_t max_response_bytes)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());

}  // namespace kvc::cachesvc
