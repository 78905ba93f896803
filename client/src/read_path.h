// ReadPath: one way Fetch and FetchInto bring a sequence's KV into this process. Three exist:
// gRPC (the Fetch stream; always there), the same-node mapping (local_reader.h) and a transfer
// channel (transfer_reader.h). KvCacheClient holds the one its selector decided on
// (data_paths.cc: explicit state, decided on first use and again after a path broke) and
// calls it the same way whichever it is; a path that cannot serve one call says why and that
// call falls back to gRPC, with the reason in FetchResult::path.
//
// The two leased paths share one flow (LeasedReadPath::Read): lease the layers, bring the
// lease's blocks here as the pool's arenas (OpenLeased: mapped or received), decode them with
// lease_decode.h, end the lease. A new transport is one OpenLeased and one line in the
// selector.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/src/lease_decode.h"
#include "kvc/client/kv_cache_client.h"
#include "kvc/client/types.h"

namespace kvc::client::internal {

using ChunkFn = std::function<absl::Status(FetchedChunk&)>;

class ReadPath {
 public:
  virtual ~ReadPath() = default;
  // What FetchResult::path says when this path served a call: "shared-memory (PATH)",
  // "transfer (HOST:PORT)", "grpc".
  virtual std::string name() const = 0;
  // False once the path broke (the server's end closed, the stream failed): the selector
  // decides again. Never blocks.
  virtual bool Alive() = 0;

  // FetchChunks: the chunks a gRPC Fetch with `options` gives, in its order. When this path
  // cannot serve the call it sets *fall_back to "grpc (why)" before any chunk was delivered,
  // and the caller reads over gRPC; the status is then meaningless.
  virtual absl::Status ReadChunks(const std::string& sequence_id, const FetchOptions& options,
                                  const ChunkFn& on_chunk, const CallOptions& call,
                                  std::string* fall_back) = 0;
  // FetchInto, buffers already checked (one per layer in `layers`, same order). *fall_back
  // as above, set before anything was written.
  virtual absl::Status ReadInto(const std::string& sequence_id, const std::vector<int32_t>& layers,
                                const std::vector<LayerBuffers>& buffers,
                                const FetchIntoOptions& options, const CallOptions& call,
                                FetchIntoResult* result, std::string* fall_back) = 0;
};

// A lease's blocks brought into this process, readable as the pool's arenas while this
// object lives (and, for the mapping, while the lease does).
class LeasedBlocks {
 public:
  virtual ~LeasedBlocks() = default;
  // The lease as arenas() numbers its blocks (a transfer renumbers them to its payload).
  virtual const Lease& lease() const = 0;
  virtual ArenaLookup arenas() const = 0;
};

// A path that reads leased blocks: the flow both share, around OpenLeased.
class LeasedReadPath : public ReadPath {
 public:
  explicit LeasedReadPath(KvCacheClient& client) : client_(client) {}
  absl::Status ReadChunks(const std::string& sequence_id, const FetchOptions& options,
                          const ChunkFn& on_chunk, const CallOptions& call,
                          std::string* fall_back) final;
  absl::Status ReadInto(const std::string& sequence_id, const std::vector<int32_t>& layers,
                        const std::vector<LayerBuffers>& buffers, const FetchIntoOptions& options,
                        const CallOptions& call, FetchIntoResult* result,
                        std::string* fall_back) final;

 protected:
  // The lease's blocks here. UNIMPLEMENTED: this path cannot carry this lease (a device
  // pool's, another server's); any failure after which Alive() is false is the path's, not
  // the lease's. Both fall back to gRPC; other errors are the call's.
  virtual absl::StatusOr<std::unique_ptr<LeasedBlocks>> OpenLeased(const Lease& lease,
                                                                   absl::Time deadline) = 0;
  // The path's part that breaks, for the fall-back reason: "the transfer channel".
  virtual const char* what() const = 0;

 private:
  // Lease `layers`, open, run `read` over the blocks, end the lease.
  absl::Status Read(const std::string& sequence_id, const std::vector<int32_t>& layers,
                    const CallOptions& call,
                    const std::function<absl::Status(const LeasedBlocks&)>& read,
                    std::string* fall_back);

  KvCacheClient& client_;  // outlives every path it holds
};

class LocalReader;
class TransferReader;

// The paths; `client` must outlive them (it owns them).
std::shared_ptr<ReadPath> MakeGrpcReadPath(KvCacheClient& client, const KvCacheClient::Impl& impl);
std::shared_ptr<ReadPath> MakeLocalReadPath(KvCacheClient& client,
                                            std::shared_ptr<LocalReader> reader);
std::shared_ptr<ReadPath> MakeTransferReadPath(KvCacheClient& client,
                                               std::unique_ptr<TransferReader> reader);

}  // namespace kvc::client::internal
