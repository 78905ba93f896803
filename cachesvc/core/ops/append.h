// Append: one layer's new keys and values into a sequence, all or nothing. The rows enter
// the newest tier (the raw residual when there is one; tokens it no longer holds age into
// the older tier) and the sequence's automatic policy (StreamingLLM, H2O) evicts in the same
// transaction, so a failed append changes nothing and may simply be retried.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/base/requests.h"
#include "cachesvc/core/ops/transaction.h"
#include "cachesvc/core/plan/eviction_rule.h"
#include "cachesvc/core/sequence/sequence.h"

namespace kvc::cachesvc {

// Checks the request against the pool's shape (no lock needed): layer, num_tokens (1..
// max_tokens), positions, payload sizes. Returns the payload dtype.
absl::StatusOr<DType> ValidateAppend(const AppendParams& params, const PoolOptions& pool,
                                     int64_t max_tokens);

// An append planned with the sequence's lock held (PrepareAppend), to be executed
// (tx->Execute(): with the lock released when `unlocked`, the layer marked with
// Sequence::BeginWrite meanwhile) and published with the lock held again (FinishAppend).
struct PreparedAppend {
  std::unique_ptr<Transaction> tx;
  int layer = 0;
  int64_t layer_tokens = 0;  // the layer's tokens after the commit
  EvictionRule rule;
  int64_t evicted = 0;
  // The transaction writes nothing a stored token occupies (Transaction::WritesInPlace) and
  // the pool is on the host: Execute may run without the lock.
  bool unlocked = false;
};

// Checks the order (FAILED_PRECONDITION when start_position is not the layer's next token),
// runs the automatic policy's selection and plans every lane. Requires that no write of the
// layer is in flight (Sequence::AwaitLayerIdle).
absl::StatusOr<PreparedAppend> PrepareAppend(Sequence& seq, const AppendParams& params, DType dtype)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());
// Commits an executed append and returns the layer's and the sequence's new lengths.
AppendResult FinishAppend(Sequence& seq, PreparedAppend& prepared)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());

}  // namespace kvc::cachesvc
