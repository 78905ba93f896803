// Reading a lease's records out of bytes laid out as the pool's arenas: the shared-memory
// mapping (local_reader.h) and the blocks a transfer channel delivered (transfer_reader.h)
// are two sources of the same thing, so the decode below serves both. Records in other
// formats than the requested dtype's raw one are decoded with the kernels' codec
// (record_decode.h). Neither function keeps anything.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "kvc/client/types.h"

namespace kvc::client::internal {

// One storage format's arena as this process sees it: block b at base + b * block_bytes.
struct ArenaView {
  const uint8_t* base = nullptr;
  int64_t bytes = 0;
};
using ArenaLookup = std::function<absl::StatusOr<ArenaView>(StorageFormat)>;

// OK when this client can decode every record the lease names (each storage format and the
// dtype known here); UNIMPLEMENTED naming the first it cannot (a newer server's format): read
// that sequence over gRPC, where the server decodes. ReadLeased and ReadLeasedInto check it
// first, and the leased read path before it brings any block here.
absl::Status CheckDecodable(const Lease& lease);

// The lease's records below each layer's limit (visible tokens, or every appended token
// with include_unfinished), one chunk per (lane, segment), lanes in lease order: the chunks
// a gRPC Fetch of the same layers would give, byte for byte. ABORTED when the lease could
// have ended before the read finished.
absl::Status ReadLeased(const Lease& lease, const FetchOptions& options, const ArenaLookup& arenas,
                        const std::function<absl::Status(FetchedChunk&)>& on_chunk);
// The same records as dense options.dtype rows straight into the buffers (one per leased
// layer, in lease order; shape checked against the lease, and every lane's count against
// capacity_tokens, before anything is written). Appends to result->lane_tokens and
// result->positions.
absl::Status ReadLeasedInto(const Lease& lease, const std::vector<LayerBuffers>& buffers,
                            const FetchIntoOptions& options, const ArenaLookup& arenas,
                            FetchIntoResult* result);

}  // namespace kvc::client::internal
