// Reads never serve a corrupt shared block (issue 14, "correctness by design"). A block
// published in the prefix cache is frozen with the checksum taken when it was published
// (block_shares.h). Before a Fetch, Attend or Compress reads a sequence (Compress would copy
// what survives into blocks of the sequence's own, which carry no checksum), SharedReadCheck:
//   - refuses, at once, a read that touches a block already found corrupt (any sequence that
//     attached it; cheap: nothing is looked up while no block is marked);
//   - on a sampled fraction of reads (1 in KvStoreOptions::verify_shared_reads_every),
//     recomputes the checksum of every checksummed block the read touches and compares.
//     Fetch, Attend and Compress calls count toward the same store-wide sampler.
// A mismatch marks the block corrupt, drops the prefix-cache entries holding it (later
// lookups miss) and fails the read with DATA_LOSS; nothing of the read is sent. Blocks a
// sequence wrote itself carry no checksum: only shared bytes are checked.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "cachesvc/core/prefix/prefix_index.h"
#include "cachesvc/core/sequence/sequence.h"

namespace kvc::cachesvc {

struct SharedReadCheck {
  PrefixIndex* index = nullptr;  // the sequence's pool's
  bool verify = false;           // this read is one of the sampled ones
};

// Picks 1 read in `every` (>= 1) for verification, counted across the store.
class ReadSampler {
 public:
  explicit ReadSampler(int64_t every) : every_(every < 1 ? 1 : every) {}
  bool Next() { return count_.fetch_add(1, std::memory_order_relaxed) % every_ == 0; }

 private:
  const uint64_t every_;
  std::atomic<uint64_t> count_{0};
};

// Checks the blocks of `layers` (empty: every layer) of `seq` as described above. DATA_LOSS
// naming the sequence, layer and kv head of the first corrupt block; INTERNAL when reading
// the blocks fails.
absl::Status CheckSharedReads(const Sequence& seq, absl::Span<const int> layers,
                              const SharedReadCheck& check) ABSL_SHARED_LOCKS_REQUIRED(seq.mu());

}  // namespace kvc::cachesvc
