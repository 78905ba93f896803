// Endpoint: one kvcached of a cluster as the cluster client sees it — the data client, who the
// process answering at this address is (GetServerInfo), whether it serves (a grpc.health.v1
// Watch held open by a thread of its own, so a crash or a drain is seen at once) and whether
// it is ejected for failing calls (a hang shows only that way).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvc/client/cluster_client.h"
#include "kvc/client/kv_cache_client.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace kvc::client::internal {

class Endpoint {
 public:
  // Dials `address` (lazily) with `options.client`; the watch thread starts at once.
  static absl::StatusOr<std::shared_ptr<Endpoint>> Create(const std::string& address,
                                                          const ClusterOptions& options);
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  // Stops the watch thread (cancelling its call) and joins it.
  ~Endpoint();

  const std::string& address() const { return address_; }
  const std::shared_ptr<KvCacheClient>& client() const { return client_; }

  // What routing and placement need, read under one lock.
  struct View {
    std::string shard;
    std::string incarnation;
    double weight = 0;
    bool identified = false;  // GetServerInfo answered since the last connection loss
    bool connected = false;   // the health watch is open
    bool serving = false;     // the watch's last status was SERVING
    bool ejected = false;
    int64_t failures_in_row = 0;
    std::string last_error;
    absl::Time down_since = absl::InfinitePast();  // when the watch last broke
  };
  View view(absl::Time now) const;
  ShardStatus status(absl::Time now) const;

  // A routed call's outcome: UNAVAILABLE and DEADLINE_EXCEEDED count toward ejection, any
  // answer from the server (OK or an error of the request) resets the count.
  void Report(const absl::Status& status);
  void CountCall();

  void set_listed(bool listed);
  bool listed() const;
  // For an ejected endpoint whose ejection time is over: a health check with the health
  // timeout; SERVING readmits it, anything else ejects it again for longer.
  void ProbeIfDue(absl::Time now);

 private:
  Endpoint(std::string address, const ClusterOptions& options,
           std::shared_ptr<KvCacheClient> client, const std::shared_ptr<grpc::Channel>& health);
  void WatchLoop();
  // While the shard drains: health checks every probe_interval. True when it serves again;
  // false when it stops answering (or on stop).
  bool PollWhileDraining();
  // One grpc.health.v1 Check of the whole server with the health timeout.
  grpc::Status CheckHealth(grpc::health::v1::HealthCheckResponse* response) const;
  // Sleeps up to `d` unless stopped; returns false once stopped.
  bool SleepUnlessStopped(absl::Duration d);
  void Eject(absl::Time now, const std::string& why);

  const std::string address_;
  const ClusterOptions options_;
  const std::shared_ptr<KvCacheClient> client_;
  // Shares the data client's connection (same target and arguments). Thread-safe.
  const std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;

  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  grpc::ClientContext* watch_context_ = nullptr;  // the open Watch, to cancel on stop
  View view_;
  bool listed_ = true;
  absl::Time ejected_until_ = absl::InfinitePast();
  int ejections_in_row_ = 0;
  int64_t calls_ = 0;
  int64_t failures_ = 0;
  int64_t ejections_ = 0;
  int64_t restarts_seen_ = 0;
  std::thread thread_;
};

}  // namespace kvc::client::internal
