// Compress: evicts (StreamingLLM, SnapKV, H2O) and/or converts a sequence's storage, and may
// set a raw residual on a sequence still stored raw, in one transaction: validate -> score
// (new scores, not yet stored) -> select (metadata only) -> plan every lane -> allocate ->
// write -> commit. A refused or failed Compress leaves the sequence exactly as it was.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "cachesvc/core/requests.h"
#include "cachesvc/core/sequence.h"

namespace kvc::cachesvc {

// The request's queries by layer (null where none were sent), after checking the spec and
// the queries against the pool (no lock needed).
absl::StatusOr<std::vector<const LayerQueries*>> ValidateCompress(const CompressParams& params,
                                                                  const PoolGeometry& geometry);

absl::StatusOr<CompressResult> CompressLocked(Sequence& seq, const CompressParams& params,
                                              const std::vector<const LayerQueries*>& queries)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());

}  // namespace kvc::cachesvc
