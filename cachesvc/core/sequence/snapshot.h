// What GetSequence and ListSequences report about a sequence, taken under its lock.
#pragma once

#include "cachesvc/core/base/types.h"
#include "cachesvc/core/sequence/sequence.h"

namespace kvc::cachesvc {

SequenceSnapshot SnapshotLocked(const Sequence& sequence) ABSL_SHARED_LOCKS_REQUIRED(sequence.mu());

}  // namespace kvc::cachesvc
