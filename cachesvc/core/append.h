// Append: one layer's new keys and values into a sequence, all or nothing. The rows enter
// the newest tier (the raw residual when there is one; tokens it no longer holds age into
// the older tier) and the sequence's automatic policy (StreamingLLM, H2O) evicts in the same
// transaction, so a failed append changes nothing and may simply be retried.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/requests.h"
#include "cachesvc/core/sequence.h"

namespace kvc::cachesvc {

// Checks the request against the pool's shape (no lock needed): layer, num_tokens (1..
// max_tokens), positions, payload sizes. Returns the payload dtype.
absl::StatusOr<DType> ValidateAppend(const AppendParams& params, const PoolOptions& pool,
                                     int64_t max_tokens);

// Appends a validated request. FAILED_PRECONDITION when start_position is not the layer's
// next token, RESOURCE_EXHAUSTED when the pool is full, INTERNAL when a kernel op fails;
// on error the sequence is unchanged.
absl::StatusOr<AppendResult> AppendLocked(Sequence& seq, const AppendParams& params, DType dtype)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());

}  // namespace kvc::cachesvc
