// Fetch: a sequence's stored tokens streamed out in chunks, dense in any dtype or as stored.
// The plan is a list of stored-index ranges taken under the lock (O(chunks), not O(tokens));
// each chunk is then read under the lock and handed to the sink without it. Appends that land
// meanwhile only add indices past the plan, so the Fetch serves the tokens visible when it
// started; anything that moves or drops a stored token of a layer still to be served (a new
// generation of that layer) or a Release ends it with ABORTED, never with a mix of two states.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "cachesvc/core/base/requests.h"
#include "cachesvc/core/prefix/shared_read_check.h"
#include "cachesvc/core/sequence/sequence.h"

namespace kvc::cachesvc {

inline constexpr int64_t kDefaultChunkBytes = int64_t{1} << 20;
inline constexpr int64_t kMinChunkBytes = int64_t{4} << 10;
inline constexpr int64_t kMaxChunkBytes = int64_t{3} << 20;

// Streams `params` of `seq` to `sink`; adds the payload bytes served to *fetched_bytes.
// Shared blocks are checked first (shared_read_check.h): DATA_LOSS before anything is sent.
// INVALID_ARGUMENT for a bad layer, NOT_FOUND once released, ABORTED as above, CANCELLED when
// the sink returns false.
absl::Status FetchSequence(const std::shared_ptr<Sequence>& seq, const FetchParams& params,
                           const FetchSink& sink, const SharedReadCheck& check,
                           std::atomic<int64_t>* fetched_bytes);

}  // namespace kvc::cachesvc
