// What GetSequence and ListSequences report about a sequence, taken under its lock.
#pragma once

#include "cachesvc/core/sequence.h"
#include "cachesvc/core/types.h"

namespace kvc::cachesvc {

SequenceSnapshot SnapshotLocked(const Sequence& sequence) ABSL_SHARED_LOCKS_REQUIRED(sequence.mu());

}  // namespace kvc::cachesvc
