#include "kvc/client/cluster_client.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/src/cluster/endpoint.h"
#include "client/src/cluster/resolver.h"
#include "common/cluster_id.h"

namespace kvc::client {

using internal::Endpoint;

namespace {

uint64_t Fnv1a64(absl::string_view a, absl::string_view b) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](unsigned char c) {
    h ^= c;
    h *= 0x100000001b3ull;
  };
  for (char c : a) mix(static_cast<unsigned char>(c));
  mix(0);
  for (char c : b) mix(static_cast<unsigned char>(c));
  return h;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

std::string Describe(const std::vector<ShardStatus>& shards) {
  if (shards.empty()) return "no shard is known yet";
  std::vector<std::string> parts;
  parts.reserve(shards.size());
  for (const ShardStatus& s : shards) {
    parts.push_back(absl::StrCat(
        s.shard.empty() ? "?" : s.shard, "@", s.address, " ", ShardStateName(s.state),
        s.last_error.empty() ? "" : absl::StrCat(" (", s.last_error.substr(0, 120), ")")));
  }
  return absl::StrJoin(parts, "; ");
}

class FailedAppendStream final : public AppendStream {
 public:
  explicit FailedAppendStream(absl::Status status) : status_(std::move(status)) {}
  absl::Status Write(const AppendChunk&) override { return status_; }
  absl::StatusOr<AppendStreamResult> Finish() override { return status_; }

 private:
  absl::Status status_;
};

class FailedAttendSession final : public AttendSession {
 public:
  explicit FailedAttendSession(absl::Status status) : status_(std::move(status)) {}
  absl::StatusOr<AttendResult> Attend(const AttendRequest&) override { return status_; }
  absl::Status Finish() override { return status_; }

 private:
  absl::Status status_;
};

}  // namespace

const char* ShardStateName(ShardState state) {
  switch (state) {
    case ShardState::kConnecting:
      return "connecting";
    case ShardState::kServing:
      return "serving";
    case ShardState::kDraining:
      return "draining";
    case ShardState::kEjected:
      return "ejected";
  }
  return "unknown";
}

struct ClusterClient::Impl {
  ClusterOptions options;
  mutable std::mutex mu;
  std::condition_variable stop_cv;
  bool stop = false;
  std::map<std::string, std::shared_ptr<Endpoint>> endpoints;  // by address
  std::string resolve_error;
  std::mt19937_64 random{std::random_device{}()};
  std::thread monitor;

  std::vector<std::shared_ptr<Endpoint>> Snapshot() const {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::shared_ptr<Endpoint>> out;
    for (const auto& [address, endpoint] : endpoints) out.push_back(endpoint);
    return out;
  }

  std::vector<ShardStatus> Statuses() const {
    std::vector<ShardStatus> out;
    const absl::Time now = absl::Now();
    for (const auto& endpoint : Snapshot()) out.push_back(endpoint->status(now));
    return out;
  }

  // Adds endpoints for addresses not seen before and marks which are listed now.
  void Update(const std::vector<std::string>& addresses) {
    std::vector<std::shared_ptr<Endpoint>> created;
    for (const std::string& address : addresses) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (endpoints.count(address) != 0) continue;
      }
      auto endpoint = Endpoint::Create(address, options);
      if (!endpoint.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        resolve_error = std::string(endpoint.status().message());
        continue;
      }
      std::lock_guard<std::mutex> lock(mu);
      endpoints.emplace(address, *std::move(endpoint));
    }
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [address, endpoint] : endpoints) {
      endpoint->set_listed(std::binary_search(addresses.begin(), addresses.end(), address));
    }
  }

  void Resolve() {
    if (options.dns_name.empty()) return;  // static targets: all created by Connect
    auto addresses = internal::ResolveAll(options.dns_name);
    if (!addresses.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      resolve_error = std::string(addresses.status().message());
      return;
    }
    Update(*addresses);
  }

  // Resolves every resolve_interval, probes ejected shards, and forgets addresses that left
  // DNS once they stop answering (a draining pod leaves DNS but serves its sequences).
  void MonitorLoop() {
    absl::Time next_resolve = absl::Now() + options.resolve_interval;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        stop_cv.wait_for(lock, absl::ToChronoNanoseconds(options.probe_interval),
                         [this] { return stop; });
        if (stop) return;
      }
      absl::Time now = absl::Now();
      if (now >= next_resolve) {
        Resolve();
        next_resolve = now + options.resolve_interval;
      }
      std::vector<std::shared_ptr<Endpoint>> gone;
      for (const auto& endpoint : Snapshot()) {
        endpoint->ProbeIfDue(now);
        const Endpoint::View v = endpoint->view(absl::Now());
        if (!endpoint->listed() && !v.connected &&
            absl::Now() - v.down_since > 2 * options.resolve_interval) {
          gone.push_back(endpoint);
        }
      }
      if (!gone.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& endpoint : gone) endpoints.erase(endpoint->address());
      }
      // `gone` joins the endpoints' threads here, outside the lock.
    }
  }

  // The endpoint that holds `sequence_id`, or why none can serve it.
  absl::StatusOr<std::shared_ptr<Endpoint>> Route(const std::string& sequence_id) const {
    ClusterIdParts id;
    if (!ParseClusterId(sequence_id, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence id '", sequence_id.substr(0, 64),
          "' is not a cluster id (<shard>:<incarnation>:<id>); use ids returned by this "
          "cluster's CreateSequence"));
    }
    const absl::Time now = absl::Now();
    std::string restarted_as;
    std::string down_because;
    for (const auto& endpoint : Snapshot()) {
      const Endpoint::View v = endpoint->view(now);
      if (v.shard != id.shard) continue;
      if (v.incarnation != id.incarnation) {
        if (v.connected && v.identified) restarted_as = v.incarnation;
        continue;
      }
      if (v.connected && v.identified && !v.ejected) return endpoint;
      down_because = v.ejected ? absl::StrCat("ejected: ", v.last_error) : v.last_error;
    }
    if (!restarted_as.empty() && down_because.empty()) {
      return absl::NotFoundError(
          absl::StrCat("sequence '", sequence_id.substr(0, 96), "' is gone: shard '", id.shard,
                       "' restarted (incarnation ", id.incarnation, ", now ", restarted_as,
                       ") and holds none of its earlier sequences; recompute it"));
    }
    return absl::UnavailableError(absl::StrCat(
        "shard '", id.shard, "', which holds sequence '", sequence_id.substr(0, 96),
        "', is unreachable",
        down_because.empty() ? "" : absl::StrCat(" (", down_because.substr(0, 160), ")"),
        "; a sequence lives only on its shard: recompute it (new sequences go to the shards "
        "that serve)"));
  }

  // Serving shards by descending placement score for `key`, one endpoint per shard name.
  std::vector<std::shared_ptr<Endpoint>> Candidates(const std::string& key) const {
    const absl::Time now = absl::Now();
    std::vector<std::pair<double, std::shared_ptr<Endpoint>>> scored;
    std::vector<std::string> names;
    for (const auto& endpoint : Snapshot()) {
      const Endpoint::View v = endpoint->view(now);
      if (!v.connected || !v.identified || !v.serving || v.ejected || v.shard.empty()) continue;
      if (std::find(names.begin(), names.end(), v.shard) != names.end()) continue;
      names.push_back(v.shard);
      scored.emplace_back(PlacementScore(key, v.shard, v.weight), endpoint);
    }
    std::sort(scored.begin(), scored.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<std::shared_ptr<Endpoint>> out;
    out.reserve(scored.size());
    for (auto& [score, endpoint] : scored) out.push_back(std::move(endpoint));
    return out;
  }

  template <typename Result, typename Fn>
  Result Routed(const std::string& sequence_id, Fn&& call) {
    auto endpoint = Route(sequence_id);
    if (!endpoint.ok()) return endpoint.status();
    (*endpoint)->CountCall();
    Result result = call(*(*endpoint)->client());
    (*endpoint)->Report(StatusOf(result));
    return result;
  }
};

ClusterClient::ClusterClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ClusterClient::~ClusterClient() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->stop_cv.notify_all();
  if (impl_->monitor.joinable()) impl_->monitor.join();
}

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Connect(
    const ClusterOptions& options) {
  if (options.targets.empty() == options.dns_name.empty()) {
    return absl::InvalidArgumentError(
        "give either targets (host:port of each shard) or dns_name (host:port resolving to "
        "every shard), not both or neither");
  }
  if (options.eject_after_failures < 1) {
    return absl::InvalidArgumentError("eject_after_failures must be >= 1");
  }
  if (options.eject_time <= absl::ZeroDuration() || options.max_eject_time < options.eject_time ||
      options.health_timeout <= absl::ZeroDuration() ||
      options.probe_interval <= absl::ZeroDuration() ||
      options.resolve_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "eject_time, health_timeout, probe_interval and resolve_interval must be positive, "
        "max_eject_time >= eject_time");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (impl->options.client.max_reconnect_backoff == absl::ZeroDuration()) {
    impl->options.client.max_reconnect_backoff = absl::Seconds(1);
  }
  if (!options.dns_name.empty()) {
    // Malformed names fail now; a name without addresses yet is retried by the monitor.
    auto resolved = internal::ResolveAll(options.dns_name);
    if (!resolved.ok() && resolved.status().code() == absl::StatusCode::kInvalidArgument) {
      return resolved.status();
    }
    if (resolved.ok()) impl->Update(*resolved);
  } else {
    std::vector<std::string> targets = options.targets;
    std::sort(targets.begin(), targets.end());
    if (std::adjacent_find(targets.begin(), targets.end()) != targets.end()) {
      return absl::InvalidArgumentError("targets lists a shard twice");
    }
    for (const std::string& target : targets) {
      auto endpoint = Endpoint::Create(target, impl->options);
      if (!endpoint.ok()) return endpoint.status();
      impl->endpoints.emplace(target, *std::move(endpoint));
    }
  }
  Impl* raw = impl.get();
  impl->monitor = std::thread([raw] { raw->MonitorLoop(); });
  return std::unique_ptr<ClusterClient>(new ClusterClient(std::move(impl)));
}

absl::Status ClusterClient::WaitForShards(int min_serving, absl::Duration timeout) const {
  const absl::Time until = absl::Now() + timeout;
  for (;;) {
    int serving = 0;
    for (const ShardStatus& s : impl_->Statuses()) serving += s.state == ShardState::kServing;
    if (serving >= min_serving) return absl::OkStatus();
    if (absl::Now() >= until) {
      std::string resolve_error;
      {
        std::lock_guard<std::mutex> lock(impl_->mu);
        resolve_error = impl_->resolve_error;
      }
      return absl::DeadlineExceededError(
          absl::StrCat(serving, " of the ", min_serving, " shards wanted serve after ",
                       absl::FormatDuration(timeout), ": ", Describe(impl_->Statuses()),
                       resolve_error.empty() ? "" : absl::StrCat("; resolving: ", resolve_error)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

double ClusterClient::PlacementScore(const std::string& key, const std::string& shard,
                                     double weight) {
  const uint64_t h = SplitMix64(Fnv1a64(key, shard));
  const double u = (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;  // in (0, 1)
  return -weight / std::log(u);
}

absl::StatusOr<std::string> ClusterClient::PlacementOf(const std::string& key) const {
  const auto candidates = impl_->Candidates(key);
  if (candidates.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no shard takes new sequences: ", Describe(impl_->Statuses())));
  }
  return candidates.front()->view(absl::Now()).shard;
}

absl::StatusOr<std::string> ClusterClient::ShardOf(const std::string& sequence_id) {
  ClusterIdParts id;
  if (!ParseClusterId(sequence_id, &id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence id '", sequence_id.substr(0, 64), "' is not a cluster id"));
  }
  return std::string(id.shard);
}

absl::StatusOr<SequenceInfo> ClusterClient::CreateSequence(const CreateSequenceOptions& options,
                                                           const CallOptions& call) {
  std::string key = options.client_sequence_id;
  if (key.empty()) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    key = absl::StrFormat("%016x", impl_->random());
  }
  const auto candidates = impl_->Candidates(key);
  if (candidates.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no shard takes new sequences: ", Describe(impl_->Statuses())));
  }
  // Only UNAVAILABLE moves on to the next shard: the request did not get through (or the
  // shard drains, which creates nothing). Anything else is the answer.
  absl::Status last;
  const size_t tries = std::min<size_t>(candidates.size(), 3);
  for (size_t i = 0; i < tries; ++i) {
    const auto& endpoint = candidates[i];
    endpoint->CountCall();
    auto created = endpoint->client()->CreateSequence(options, call);
    if (created.ok() || created.status().code() != absl::StatusCode::kUnavailable) {
      endpoint->Report(created.status());
      if (created.ok() && !ParseClusterId(created->sequence_id, /*parts=*/nullptr)) {
        return absl::FailedPreconditionError(
            absl::StrCat("the server at ", endpoint->address(), " returned id '",
                         created->sequence_id.substr(0, 64),
                         "', not a cluster id: start every shard with --shard=<name>"));
      }
      return created;
    }
    // A draining shard's refusal is not a failure of the shard.
    if (!absl::StrContains(created.status().message(), "draining")) {
      endpoint->Report(created.status());
    }
    last = created.status();
  }
  return absl::UnavailableError(
      absl::StrCat("no shard took the new sequence (", tries, " tried); last: ", last.message()));
}

absl::StatusOr<AppendResult> ClusterClient::Append(const AppendChunk& chunk,
                                                   const CallOptions& call) {
  return impl_->Routed<absl::StatusOr<AppendResult>>(
      chunk.sequence_id, [&](KvCacheClient& c) { return c.Append(chunk, call); });
}

std::unique_ptr<AppendStream> ClusterClient::StartAppendStream(const std::string& sequence_id,
                                                               const CallOptions& call) {
  auto endpoint = impl_->Route(sequence_id);
  if (!endpoint.ok()) return std::make_unique<FailedAppendStream>(endpoint.status());
  (*endpoint)->CountCall();
  return (*endpoint)->client()->StartAppendStream(call);
}

absl::Status ClusterClient::FetchChunks(const std::string& sequence_id, const FetchOptions& options,
                                        const std::function<absl::Status(FetchedChunk&)>& on_chunk,
                                        const CallOptions& call) {
  return impl_->Routed<absl::Status>(sequence_id, [&](KvCacheClient& c) {
    return c.FetchChunks(sequence_id, options, on_chunk, call);
  });
}

absl::StatusOr<FetchResult> ClusterClient::Fetch(const std::string& sequence_id,
                                                 const FetchOptions& options,
                                                 const CallOptions& call) {
  return impl_->Routed<absl::StatusOr<FetchResult>>(
      sequence_id, [&](KvCacheClient& c) { return c.Fetch(sequence_id, options, call); });
}

absl::StatusOr<FetchIntoResult> ClusterClient::FetchInto(const std::string& sequence_id,
                                                         const std::vector<LayerBuffers>& buffers,
                                                         const FetchIntoOptions& options,
                                                         const CallOptions& call) {
  return impl_->Routed<absl::StatusOr<FetchIntoResult>>(sequence_id, [&](KvCacheClient& c) {
    return c.FetchInto(sequence_id, buffers, options, call);
  });
}

absl::StatusOr<SequenceInfo> ClusterClient::GetSequence(const std::string& sequence_id,
                                                        const CallOptions& call) {
  return impl_->Routed<absl::StatusOr<SequenceInfo>>(
      sequence_id, [&](KvCacheClient& c) { return c.GetSequence(sequence_id, call); });
}

absl::StatusOr<ReleaseResult> ClusterClient::Release(const std::string& sequence_id,
                                                     const CallOptions& call) {
  return impl_->Routed<absl::StatusOr<ReleaseResult>>(
      sequence_id, [&](KvCacheClient& c) { return c.Release(sequence_id, call); });
}

absl::StatusOr<CompressResult> ClusterClient::Compress(const std::string& sequence_id,
                                                       const CompressionSpec& spec,
                                                       const std::vector<LayerQueries>& queries,
                                                       const CallOptions& call) {
  return impl_->Routed<absl::StatusOr<CompressResult>>(
      sequence_id, [&](KvCacheClient& c) { return c.Compress(sequence_id, spec, queries, call); });
}

absl::StatusOr<CompressResult> ClusterClient::Compress(
    const std::string& sequence_id, const CompressionSpec& spec,
    const std::vector<LayerQueryStats>& query_stats, const CallOptions& call) {
  return impl_->Routed<absl::StatusOr<CompressResult>>(sequence_id, [&](KvCacheClient& c) {
    return c.Compress(sequence_id, spec, query_stats, call);
  });
}

absl::StatusOr<AttendResult> ClusterClient::Attend(const AttendRequest& request,
                                                   const CallOptions& call) {
  return impl_->Routed<absl::StatusOr<AttendResult>>(
      request.sequence_id, [&](KvCacheClient& c) { return c.Attend(request, call); });
}

std::unique_ptr<AttendSession> ClusterClient::StartAttendSession(const std::string& sequence_id,
                                                                 const CallOptions& call) {
  auto endpoint = impl_->Route(sequence_id);
  if (!endpoint.ok()) return std::make_unique<FailedAttendSession>(endpoint.status());
  (*endpoint)->CountCall();
  return (*endpoint)->client()->StartAttendSession(call);
}

std::vector<ShardStatus> ClusterClient::Shards() const { return impl_->Statuses(); }

absl::StatusOr<std::shared_ptr<KvCacheClient>> ClusterClient::EndpointClient(
    const std::string& address) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->endpoints.find(address);
  if (it == impl_->endpoints.end()) {
    return absl::NotFoundError(absl::StrCat("no shard at '", address.substr(0, 128), "'"));
  }
  return it->second->client();
}

}  // namespace kvc::client
