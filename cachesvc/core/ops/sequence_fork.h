// Fork of a live sequence: a new sequence that starts with everything the source stores now
// (every tier of every lane, positions, scores, layer tokens) and shares its whole blocks by
// holder counts instead of copying them. Only each segment's partly filled last block is
// copied, so each side appends into a block of its own. The shared blocks are frozen
// (block_shares.h): from then on any mutation of either sequence that would change one
// copies it first (lane_plan.h), so the other keeps reading what it forked.
#pragma once

#include "absl/status/status.h"
#include "cachesvc/core/sequence/sequence.h"

namespace kvc::cachesvc {

// Makes `child` (new: no tokens, same pool, scope, tenant and policy as `source`) a copy of
// `source`. All-or-nothing: RESOURCE_EXHAUSTED when the pool cannot hold the copied last
// blocks or the tenant's quota cannot hold the child's blocks (the child holds, and pays for,
// every block it shares, as an attached prefix does), INTERNAL when the copy op fails; then
// nothing changed. The caller holds both locks; the source's shared lock is enough (only the
// pool's holder counts change on its side).
absl::Status ForkLocked(const Sequence& source, Sequence& child)
    ABSL_SHARED_LOCKS_REQUIRED(source.mu()) ABSL_EXCLUSIVE_LOCKS_REQUIRED(child.mu());

}  // namespace kvc::cachesvc
