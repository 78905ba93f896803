// Prometheus metrics of kvcached, served over HTTP (/metrics) by prometheus-cpp.
// Pool gauges are read from the KvStore at scrape time, so they are never stale; RPC
// counters and latency histograms are recorded by the RPC layer through RecordRpc.
// Names follow Prometheus conventions (docs/OPERATIONS.md lists them).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cachesvc/core/store/kv_store.h"

namespace prometheus {
class Exposer;
class Registry;
template <typename T>
class Family;
class Counter;
class Histogram;
class Gauge;
}  // namespace prometheus

namespace kvc::cachesvc {

class Metrics {
 public:
  // Creates the metrics and, when `listen` is non-empty, serves them on http://listen/metrics
  // (port 0 picks a free port). UNAVAILABLE when the address cannot be bound.
  // Per-tenant series carry the tenant's name when `name_all_tenants` (tenants come from
  // configured credentials, a bounded set) or the tenant has a quota entry; other tenants
  // (free-text labels without authentication) are summed as tenant="_other", so a client
  // cannot grow the label set without bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& listen, KvStore* store,
                                                         bool name_all_tenants = false);
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;
  ~Metrics();

  // "host:port" actually bound, or "" when not serving.
  const std::string& address() const { return address_; }

  // One finished RPC. `code_name` is the gRPC code name (OK, INVALID_ARGUMENT, ...).
  // Thread-safe and non-blocking apart from prometheus-cpp's short label lookup.
  void RecordRpc(const char* service, const char* method, const char* code_name, double seconds,
                 int64_t received_bytes, int64_t sent_bytes);
  void SetDraining(bool draining);
  // A call refused for missing or invalid credentials.
  void RecordAuthFailure();
  // A call refused by an authenticated tenant's call limit ("streams", "compute_calls").
  void RecordQuotaRefusal(const std::string& tenant, const char* limit);
  // A same-node socket event (local_socket.h): "connected", "refused" or "arena".
  void RecordLocalSocketEvent(const char* event);
  // A transfer channel event (cachesvc/transport/tcp_channels.h): "opened", "connected", "refused",
  // "sent", "failed", "closed"; and the payload bytes a SendLease wrote.
  void RecordTransferEvent(const char* event);
  void RecordTransferBytes(int64_t bytes);

  // The text exposition, as a scrape would return it (for tests and debugging).
  std::string Serialize() const;

 private:
  Metrics() = default;
  class PoolCollector;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<PoolCollector> pools_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Histogram>* duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* received_ = nullptr;
  prometheus::Family<prometheus::Counter>* sent_ = nullptr;
  prometheus::Gauge* draining_ = nullptr;
  prometheus::Counter* auth_failures_ = nullptr;
  prometheus::Family<prometheus::Counter>* quota_refusals_ = nullptr;
  prometheus::Family<prometheus::Counter>* local_socket_ = nullptr;
  prometheus::Family<prometheus::Counter>* transfer_events_ = nullptr;
  prometheus::Counter* transfer_bytes_ = nullptr;
  std::string address_;
};

}  // namespace kvc::cachesvc
