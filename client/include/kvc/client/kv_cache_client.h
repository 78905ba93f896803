// KvCacheClient: the engine-facing C++ API of kvcache.
//
//   auto client = kvc::client::KvCacheClient::Connect({.target = "127.0.0.1:50051"});
//   auto seq = (*client)->CreateSequence({});
//   (*client)->Append({seq->sequence_id, layer, pos, n, DType::kF16, k, v, bytes});
//   auto kv = (*client)->Fetch(seq->sequence_id, {});
//
// Every call returns absl::Status codes as the service sent them (INVALID_ARGUMENT,
// NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ...). Each call has a deadline
// (ClientOptions::default_deadline unless CallOptions says otherwise). Only idempotent
// reads (GetSequence, Fetch before its first chunk) are retried, and only on UNAVAILABLE,
// with exponential backoff. Thread-safe: share one client per process.
//
// Operators' calls (pools, statistics, listings, evictions, leases of every tenant, drain,
// server info) are kvc::client::AdminClient's (kvc/client/admin_client.h); it can run over
// this client's channel (AdminClient::Over).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvc/client/options.h"
#include "kvc/client/types.h"

namespace kvc::client {

class AppendStream;
class AttendSession;

class KvCacheClient {
 public:
  // Creates the channel (connection is lazy: an unreachable target, or a failed TLS
  // handshake, shows up as UNAVAILABLE on the first call). INVALID_ARGUMENT for bad options
  // or an unreadable TLS file (the message names it).
  static absl::StatusOr<std::unique_ptr<KvCacheClient>> Connect(const ClientOptions& options);
  KvCacheClient(const KvCacheClient&) = delete;
  KvCacheClient& operator=(const KvCacheClient&) = delete;
  ~KvCacheClient();

  absl::StatusOr<SequenceInfo> CreateSequence(const CreateSequenceOptions& options,
                                              const CallOptions& call = {});
  // A new sequence starting with everything `sequence_id` stores now; whole blocks shared,
  // copy-on-write (the ForkSequence RPC). `client_sequence_id` names the fork (optional).
  // Not retried: a lost reply would make a retry fork twice.
  absl::StatusOr<SequenceInfo> ForkSequence(const std::string& sequence_id,
                                            const std::string& client_sequence_id = "",
                                            const CallOptions& call = {});
  absl::StatusOr<AppendResult> Append(const AppendChunk& chunk, const CallOptions& call = {});
  // A client-streaming append for large prefills; see AppendStream.
  std::unique_ptr<AppendStream> StartAppendStream(const CallOptions& call = {});

  // Calls `on_chunk` for each chunk as it arrives; a non-OK return cancels the stream and
  // is returned. Retried on UNAVAILABLE only before the first chunk; a stream that breaks
  // after one returns its error ("Fetch broke after some chunks: ...").
  absl::Status FetchChunks(const std::string& sequence_id, const FetchOptions& options,
                           const std::function<absl::Status(FetchedChunk&)>& on_chunk,
                           const CallOptions& call = {});
  // Fetches and assembles the whole sequence per (layer, kv head).
  absl::StatusOr<FetchResult> Fetch(const std::string& sequence_id, const FetchOptions& options,
                                    const CallOptions& call = {});
  // Fetches the buffers' layers as dense `options.dtype` straight into the caller's memory
  // (LayerBuffers): on the same node a lease's records are copied (or decoded) from the
  // mapped pool into the buffers with nothing in between; otherwise the gRPC chunks are
  // copied in. INVALID_ARGUMENT for a buffer shape or dtype that does not match the
  // sequence, OUT_OF_RANGE when a lane holds more tokens than capacity_tokens (checked before
  // anything is written on the same-node path). On any error the buffers' contents are
  // unspecified.
  absl::StatusOr<FetchIntoResult> FetchInto(const std::string& sequence_id,
                                            const std::vector<LayerBuffers>& buffers,
                                            const FetchIntoOptions& options,
                                            const CallOptions& call = {});
  absl::StatusOr<SequenceInfo> GetSequence(const std::string& sequence_id,
                                           const CallOptions& call = {});
  absl::StatusOr<ReleaseResult> Release(const std::string& sequence_id,
                                        const CallOptions& call = {});
  // Evicts and/or converts what the sequence stores. SnapKV needs `queries` for every layer
  // (the last `window` query vectors); H2O may send every prompt query. All-or-nothing.
  absl::StatusOr<CompressResult> Compress(const std::string& sequence_id,
                                          const CompressionSpec& spec,
                                          const std::vector<LayerQueries>& queries = {},
                                          const CallOptions& call = {});
  // Expected Attention: `query_stats` for every layer.
  absl::StatusOr<CompressResult> Compress(const std::string& sequence_id,
                                          const CompressionSpec& spec,
                                          const std::vector<LayerQueryStats>& query_stats,
                                          const CallOptions& call = {});
  // Decode attention of one layer computed by the service over the stored KV.
  absl::StatusOr<AttendResult> Attend(const AttendRequest& request, const CallOptions& call = {});
  // One stream for a decode loop (one Attend per layer per step); see AttendSession.
  std::unique_ptr<AttendSession> StartAttendSession(const CallOptions& call = {});

  // Prefix cache. LookupPrefix: leading tokens of `prefix` cached now for a sequence
  // storing `storage` (kPoolDefault = the pool's raw format); a hint, nothing is held.
  absl::StatusOr<int64_t> LookupPrefix(const std::string& pool, const Prefix& prefix,
                                       StorageFormat storage = StorageFormat::kPoolDefault,
                                       const CallOptions& call = {});
  // Publishes the sequence's leading whole blocks (never evicted, every layer appended)
  // under `prefix`, whose token_ids are the sequence's own.
  absl::StatusOr<PublishResult> PublishPrefix(const std::string& sequence_id, const Prefix& prefix,
                                              const CallOptions& call = {});

  // Leases (the LeaseSequence RPC): pins what the sequence's `layers` (empty = all) store
  // now for `ttl` (zero = the server's default) and says where every lane's records are.
  // Not retried: a lost reply would pin a second lease until its TTL.
  absl::StatusOr<Lease> LeaseSequence(const std::string& sequence_id,
                                      const std::vector<int32_t>& layers = {},
                                      absl::Duration ttl = absl::ZeroDuration(),
                                      const CallOptions& call = {});
  // The new expiry, never past the server's lease lifetime (10 minutes from the grant by
  // default). NOT_FOUND once the lease was released or expired; FAILED_PRECONDITION once it
  // already expires at its lifetime limit (lease the sequence again). Retried.
  absl::StatusOr<absl::Time> RenewLease(const std::string& lease_id,
                                        absl::Duration ttl = absl::ZeroDuration(),
                                        const CallOptions& call = {});
  // Ends the lease; returns the blocks that went back to the pool. Not retried (a retry
  // after a lost reply would be NOT_FOUND).
  absl::StatusOr<int64_t> ReleaseLease(const std::string& lease_id, const CallOptions& call = {});

  const ClientOptions& options() const;
  // How Fetch moves bytes: "shared-memory (PATH)", "transfer (HOST:PORT)", or "grpc (why
  // neither)". Decided on the first Fetch, and again after the path broke.
  std::string DataPath() const;
  // How Append moves bytes: "staged (N-byte region)", or "grpc (why not staged)". Decided on
  // the first Append.
  std::string AppendPath() const;

  // The library's own state (client/src/client_impl.h), opaque here: the transports beside
  // the client (client/src/transfer_rpcs.h, kvc::client::NcclLink, DeviceReader) and
  // AdminClient::Over reach the server through it.
  struct Impl;
  Impl& state() const { return *impl_; }

 private:
  explicit KvCacheClient(std::unique_ptr<Impl> impl);
  // FetchChunks, and the path it took into *path (FetchResult::path).
  absl::Status FetchChunksVia(const std::string& sequence_id, const FetchOptions& options,
                              const std::function<absl::Status(FetchedChunk&)>& on_chunk,
                              const CallOptions& call, std::string* path);
  std::unique_ptr<Impl> impl_;
};

// Streams many AppendChunks in one call. Each chunk is applied atomically and in order by
// the server; Finish() reports the totals, or the first rejected chunk's error together
// with how many earlier chunks were applied. Not thread-safe; use from one thread.
class AppendStream {
 public:
  virtual ~AppendStream() = default;
  // Sends one chunk. A non-OK status means the stream broke; call Finish() for the reason.
  virtual absl::Status Write(const AppendChunk& chunk) = 0;
  virtual absl::StatusOr<AppendStreamResult> Finish() = 0;
};

}  // namespace kvc::client

namespace kvc::client {

// A bidirectional Attend stream: each Attend() sends one request and waits for its answer.
// The deadline (CallOptions) covers the whole session. Not thread-safe.
class AttendSession {
 public:
  virtual ~AttendSession() = default;
  virtual absl::StatusOr<AttendResult> Attend(const AttendRequest& request) = 0;
  // Closes the stream; returns the server's final status.
  virtual absl::Status Finish() = 0;
};

}  // namespace kvc::client
