// ClusterClient: many kvcached shards used as one cache.
//
//   kvc::client::ClusterOptions options;
//   options.dns_name = "kvcached.kvcache.svc.cluster.local:50051";  // or options.targets
//   auto cluster = kvc::client::ClusterClient::Connect(options);
//   auto seq = (*cluster)->CreateSequence({});   // placed on one healthy shard
//   (*cluster)->Append({seq->sequence_id, ...}); // goes straight to that shard
//
// Placement: a new sequence goes to the serving shard with the highest weighted rendezvous
// score for its placement key (the client_sequence_id when given, else a random key):
//   h = splitmix64(fnv1a64(key + '\0' + shard name)),  u = ((h >> 11) + 0.5) / 2^53,
//   score = -weight / ln(u)
// so each shard gets new sequences in proportion to its weight (ServerInfo.weight), and
// adding or removing a shard moves only the placement of NEW sequences.
//
// Routing: a shard hands out ids "<shard>:<incarnation>:<local id>"; every later call on a
// sequence goes to the shard its id names, and nowhere else. A sequence lives on exactly one
// shard and this client never recreates or reads it elsewhere:
//   - the shard is unreachable (crashed, hung and ejected, removed): UNAVAILABLE at once, the
//     engine recomputes;
//   - the shard answers with another incarnation (it restarted, empty): NOT_FOUND;
//   - a draining shard (SIGTERM, kvcachectl drain) takes no new sequences but serves its
//     existing ones for as long as it answers, also after it left DNS.
//
// Health: each shard is watched with grpc.health.v1 Watch (a crash or a drain is seen at once)
// and its identity read with AdminService.GetServerInfo; a shard whose calls fail with
// UNAVAILABLE or DEADLINE_EXCEEDED `eject_after_failures` times in a row is ejected (no
// placement, calls fail fast) and rejoins when a health check answers SERVING after the
// ejection time. Thread-safe: share one ClusterClient per process.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvc/client/kv_cache_client.h"
#include "kvc/client/types.h"

namespace kvc::client {

struct ClusterOptions {
  // Exactly one of the two. targets: fixed "host:port" endpoints, one shard each. dns_name:
  // "host:port" resolved to every address it has (a Kubernetes headless Service: one per
  // ready pod), again every resolve_interval.
  std::vector<std::string> targets;
  std::string dns_name;
  absl::Duration resolve_interval = absl::Seconds(5);
  // Per-shard client options (TLS, token, deadlines, retries); `target` is ignored. Shards are
  // dialled by address, so with TLS set client.tls.server_name to a name the certificates
  // carry.
  ClientOptions client;
  int eject_after_failures = 2;                  // consecutive UNAVAILABLE/DEADLINE_EXCEEDED
  absl::Duration eject_time = absl::Seconds(1);  // doubles per ejection in a row
  absl::Duration max_eject_time = absl::Seconds(30);
  absl::Duration health_timeout = absl::Seconds(1);  // deadline of health and identity calls
  absl::Duration probe_interval = absl::Milliseconds(200);
};

enum class ShardState {
  kConnecting,  // identity or health not known yet, or the connection is down
  kServing,     // takes new sequences
  kDraining,    // serves its sequences, takes no new ones
  kEjected,     // failing calls; out of placement and routing until a probe passes
};
const char* ShardStateName(ShardState state);

struct ShardStatus {
  std::string address;      // as dialled: "ip:port" or a static target
  std::string shard;        // ServerInfo.shard ("" until known)
  std::string incarnation;  // of the process answering now
  double weight = 0;
  ShardState state = ShardState::kConnecting;
  bool listed = false;  // in the static list or the latest DNS answer
  int64_t calls = 0;    // routed through this client
  int64_t failures = 0;
  int64_t ejections = 0;
  int64_t restarts_seen = 0;  // incarnation changes observed
  std::string last_error;
};

class ClusterClient {
 public:
  // Starts watching the shards (resolving dns_name now and then every resolve_interval; a
  // name without addresses yet is not an error: WaitForShards waits for them).
  // INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<ClusterClient>> Connect(const ClusterOptions& options);
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;
  ~ClusterClient();

  // Waits until at least `min_serving` shards take new sequences; DEADLINE_EXCEEDED with each
  // shard's state otherwise.
  absl::Status WaitForShards(int min_serving, absl::Duration timeout) const;

  // Places the sequence (see above). If the chosen shard cannot be reached (UNAVAILABLE) the
  // next one by score is tried: a sequence is created on at most one shard per attempt, but a
  // request cut off mid-flight may leave an empty sequence (no KV) on the shard it reached.
  absl::StatusOr<SequenceInfo> CreateSequence(const CreateSequenceOptions& options,
                                              const CallOptions& call = {});
  absl::StatusOr<AppendResult> Append(const AppendChunk& chunk, const CallOptions& call = {});
  // A stream to the shard of `sequence_id`; every chunk must name that sequence.
  std::unique_ptr<AppendStream> StartAppendStream(const std::string& sequence_id,
                                                  const CallOptions& call = {});
  absl::Status FetchChunks(const std::string& sequence_id, const FetchOptions& options,
                           const std::function<absl::Status(FetchedChunk&)>& on_chunk,
                           const CallOptions& call = {});
  absl::StatusOr<FetchResult> Fetch(const std::string& sequence_id, const FetchOptions& options,
                                    const CallOptions& call = {});
  // KvCacheClient::FetchInto on the sequence's shard: from that shard's mapped pool when it
  // runs on this node (its EndpointClient's DataPath() says so), else over gRPC.
  absl::StatusOr<FetchIntoResult> FetchInto(const std::string& sequence_id,
                                            const std::vector<LayerBuffers>& buffers,
                                            const FetchIntoOptions& options,
                                            const CallOptions& call = {});
  absl::StatusOr<SequenceInfo> GetSequence(const std::string& sequence_id,
                                           const CallOptions& call = {});
  absl::StatusOr<ReleaseResult> Release(const std::string& sequence_id,
                                        const CallOptions& call = {});
  absl::StatusOr<CompressResult> Compress(const std::string& sequence_id,
                                          const CompressionSpec& spec,
                                          const std::vector<LayerQueries>& queries = {},
                                          const CallOptions& call = {});
  absl::StatusOr<CompressResult> Compress(const std::string& sequence_id,
                                          const CompressionSpec& spec,
                                          const std::vector<LayerQueryStats>& query_stats,
                                          const CallOptions& call = {});
  absl::StatusOr<AttendResult> Attend(const AttendRequest& request, const CallOptions& call = {});
  // A decode-loop stream to the shard of `sequence_id`.
  std::unique_ptr<AttendSession> StartAttendSession(const std::string& sequence_id,
                                                    const CallOptions& call = {});

  // Every shard this client knows, in address order.
  std::vector<ShardStatus> Shards() const;
  // The client of one known endpoint (admin calls per shard: kvcachectl); NOT_FOUND if the
  // address is not known. The client stays valid while the returned pointer is held.
  absl::StatusOr<std::shared_ptr<KvCacheClient>> EndpointClient(const std::string& address) const;
  // The shard a new sequence with this placement key would go to now; UNAVAILABLE when no
  // shard serves.
  absl::StatusOr<std::string> PlacementOf(const std::string& key) const;
  // The shard name a cluster sequence id names; INVALID_ARGUMENT for another kind of id.
  static absl::StatusOr<std::string> ShardOf(const std::string& sequence_id);
  // The rendezvous score of (key, shard, weight) (exposed for tests and other clients).
  static double PlacementScore(const std::string& key, const std::string& shard, double weight);

  struct Impl;

 private:
  explicit ClusterClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvc::client
