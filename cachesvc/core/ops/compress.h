// Compress: evicts (StreamingLLM, SnapKV, H2O) and/or converts a sequence's storage, and may
// set a raw residual on a sequence still stored raw, in one transaction: validate -> score
// (new scores, not yet stored) -> select (metadata only) -> plan every lane -> allocate ->
// write -> commit. A refused or failed Compress leaves the sequence exactly as it was.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "cachesvc/core/base/requests.h"
#include "cachesvc/core/sequence/sequence.h"

namespace kvc::cachesvc {

// The request's scoring inputs by layer (null where none were sent).
struct CompressInputs {
  std::vector<const LayerQueries*> queries;         // SnapKV, H2O
  std::vector<const LayerQueryStats*> query_stats;  // Expected Attention
};

// Checks the spec, the queries and the query statistics against the pool (no lock needed).
absl::StatusOr<CompressInputs> ValidateCompress(const CompressParams& params,
                                                const PoolGeometry& geometry);

absl::StatusOr<CompressResult> CompressLocked(Sequence& seq, const CompressParams& params,
                                              const CompressInputs& inputs)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());

}  // namespace kvc::cachesvc
