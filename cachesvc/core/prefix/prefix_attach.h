// The sequence side of the prefix cache (prefix_index.h): checking a PrefixSpec, installing
// attached blocks as a new sequence's first tokens, undoing that, and publishing a sequence's
// clean leading blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/base/requests.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/prefix/prefix_index.h"
#include "cachesvc/core/sequence/sequence.h"

namespace kvc::cachesvc {

// Most token ids one prefix request may name.
inline constexpr int64_t kMaxPrefixTokens = int64_t{1} << 22;

// INVALID_ARGUMENT naming the field: model 1-128 bytes, salt <= 128 bytes, token ids
// non-negative and at most kMaxPrefixTokens. FAILED_PRECONDITION for a policy with a raw
// residual window (its newest tokens live in another tier than a cached prefix's).
absl::Status ValidatePrefix(const PrefixSpec& prefix, const CompressionSpec& policy);

PrefixLayout LayoutOf(const PrefixSpec& prefix, const TenantScope& scope, StorageFormat format);

// Makes attached[i][lane] (held for this sequence, from PrefixIndex::Attach) the sequence's
// tokens [i * block_tokens, (i + 1) * block_tokens) on every lane, charges the tenant for
// them (RESOURCE_EXHAUSTED over its quota: then nothing is installed and the holds are
// dropped) and counts them in the pool's totals. The sequence must be new (no tokens).
absl::Status InstallAttachedLocked(Sequence& seq, StorageFormat format,
                                   const std::vector<std::vector<BlockId>>& attached)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());

// Undoes InstallAttachedLocked (a create that failed after attaching).
void DropAttachedLocked(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());

// Publishes the longest leading run of whole blocks that every lane still holds exactly as
// appended (positions 0..n-1 in the oldest tier) and every layer has.
absl::StatusOr<PublishPrefixResult> PublishLocked(Sequence& seq, PrefixIndex& index,
                                                  const PrefixSpec& prefix)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());

}  // namespace kvc::cachesvc
