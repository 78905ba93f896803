#include "cachesvc/metrics/metrics.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace kvc::cachesvc {
namespace {

prometheus::MetricFamily GaugeFamily(const char* name, const char* help) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = prometheus::MetricType::Gauge;
  return f;
}

prometheus::MetricFamily CounterFamily(const char* name, const char* help) {
  prometheus::MetricFamily f = GaugeFamily(name, help);
  f.type = prometheus::MetricType::Counter;
  return f;
}

void AddSample(prometheus::MetricFamily* family,
               std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric m;
  // Sorted like the registry's own metrics, so every series prints its labels one way.
  std::sort(labels.begin(), labels.end());
  m.label = std::move(labels);
  if (family->type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family->metric.push_back(std::move(m));
}

}  // namespace

// The prefix cache's series (prefix_index.h). Hit rate: hit / (hit + miss) tokens, where
// every lookup and every CreateSequence with a prefix counts its whole blocks.
struct PrefixFamilies {
  prometheus::MetricFamily lookups = CounterFamily(
      "kvc_prefix_lookups_total", "Prefix lookups and attaches (CreateSequence with a prefix).");
  prometheus::MetricFamily tokens = CounterFamily(
      "kvc_prefix_lookup_tokens_total", "Tokens asked for (whole blocks), by result: hit, miss.");
  prometheus::MetricFamily misses = CounterFamily(
      "kvc_prefix_misses_total",
      "Lookups that matched nothing, by why: evicted (their first block was cached and "
      "evicted since), no_prefix (never cached for this tenant, salt, model and layout); and "
      "cached blocks found corrupt (reason checksum: dropped, never served).");
  prometheus::MetricFamily attached = CounterFamily(
      "kvc_prefix_attached_tokens_total", "Tokens new sequences started with from the cache.");
  prometheus::MetricFamily corrupt_reads = CounterFamily(
      "kvc_prefix_corrupt_reads_total",
      "Fetch, Attend and Compress calls refused (DATA_LOSS): a shared block they would read "
      "failed its checksum.");
  prometheus::MetricFamily entries_total =
      CounterFamily("kvc_prefix_entries_total",
                    "Cache entries (one block of every lane), by event: "
                    "published, evicted.");
  prometheus::MetricFamily entries =
      GaugeFamily("kvc_prefix_cache_entries", "Cache entries held now.");
  prometheus::MetricFamily bytes = GaugeFamily(
      "kvc_prefix_cache_bytes",
      "Pool bytes the cache holds, by state: shared (some sequence uses them), unreferenced "
      "(only the cache: evicted first when an allocation needs room).");

  void Add(const std::string& pool, const PrefixStats& s) {
    AddSample(&lookups, {{"pool", pool}}, static_cast<double>(s.lookups));
    AddSample(&tokens, {{"pool", pool}, {"result", "hit"}}, static_cast<double>(s.hit_tokens));
    AddSample(&tokens, {{"pool", pool}, {"result", "miss"}},
              static_cast<double>(s.lookup_tokens - s.hit_tokens));
    AddSample(&misses, {{"pool", pool}, {"reason", "no_prefix"}},
              static_cast<double>(s.lookups - s.hits - s.evicted_misses));
    AddSample(&misses, {{"pool", pool}, {"reason", "evicted"}},
              static_cast<double>(s.evicted_misses));
    AddSample(&misses, {{"pool", pool}, {"reason", "checksum"}},
              static_cast<double>(s.checksum_misses));
    AddSample(&attached, {{"pool", pool}}, static_cast<double>(s.attached_tokens));
    AddSample(&corrupt_reads, {{"pool", pool}}, static_cast<double>(s.corrupt_reads));
    AddSample(&entries_total, {{"pool", pool}, {"event", "published"}},
              static_cast<double>(s.published_entries));
    AddSample(&entries_total, {{"pool", pool}, {"event", "evicted"}},
              static_cast<double>(s.evicted_entries));
    AddSample(&entries, {{"pool", pool}}, static_cast<double>(s.entries));
    AddSample(&bytes, {{"pool", pool}, {"state", "shared"}},
              static_cast<double>(s.cached_bytes - s.unreferenced_bytes));
    AddSample(&bytes, {{"pool", pool}, {"state", "unreferenced"}},
              static_cast<double>(s.unreferenced_bytes));
  }
  void AppendTo(std::vector<prometheus::MetricFamily>* families) {
    for (auto* f : {&lookups, &tokens, &misses, &attached, &corrupt_reads, &entries_total, &entries,
                    &bytes}) {
      families->push_back(std::move(*f));
    }
  }
};

// Leases (lease_table.h): live ones, the bytes they pin, and how they began and ended.
struct LeaseFamilies {
  prometheus::MetricFamily active = GaugeFamily("kvc_leases", "Leases live now.");
  prometheus::MetricFamily bytes = GaugeFamily(
      "kvc_leased_bytes", "Pool bytes live leases pin (some also held by their sequences).");
  prometheus::MetricFamily lease_only = GaugeFamily(
      "kvc_lease_only_bytes",
      "Pool bytes only leases pin (no sequence holds them); charged to the lessees' quotas.");
  prometheus::MetricFamily events = CounterFamily(
      "kvc_lease_events_total",
      "Lease events, by event: granted, renewed, released (ReleaseLease, EndLease), expired "
      "(TTL).");

  void Add(const std::string& pool, const LeaseStats& s) {
    AddSample(&active, {{"pool", pool}}, static_cast<double>(s.active));
    AddSample(&bytes, {{"pool", pool}}, static_cast<double>(s.leased_bytes));
    AddSample(&lease_only, {{"pool", pool}}, static_cast<double>(s.lease_only_bytes));
    AddSample(&events, {{"pool", pool}, {"event", "granted"}}, static_cast<double>(s.granted));
    AddSample(&events, {{"pool", pool}, {"event", "renewed"}}, static_cast<double>(s.renewed));
    AddSample(&events, {{"pool", pool}, {"event", "released"}}, static_cast<double>(s.released));
    AddSample(&events, {{"pool", pool}, {"event", "expired"}}, static_cast<double>(s.expired));
  }
  void AppendTo(std::vector<prometheus::MetricFamily>* families) {
    for (auto* f : {&active, &bytes, &lease_only, &events}) families->push_back(std::move(*f));
  }
};

// Reads every pool's usage from the store when Prometheus scrapes.
namespace {

// The process's resident memory by kind, from /proc/self/status (none where it is absent):
// shmem is the touched pages of the memfd-backed host pools (what same-node readers map),
// anon the heap and anonymous pools, file the mapped binaries and libraries. Pool gauges
// count blocks in use; these count the pages they and freed blocks occupy.
prometheus::MetricFamily ResidentFamily() {
  auto family = GaugeFamily("kvc_process_resident_bytes",
                            "Resident memory of kvcached by kind (anon, file, shmem).");
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    for (const auto& [field, kind] : {std::pair<const char*, const char*>{"RssAnon:", "anon"},
                                      {"RssFile:", "file"},
                                      {"RssShmem:", "shmem"}}) {
      if (line.rfind(field, 0) != 0) continue;
      const double kib = std::strtod(line.c_str() + std::strlen(field), nullptr);  // "  123 kB"
      AddSample(&family, {{"kind", kind}}, kib * 1024.0);
    }
  }
  return family;
}

}  // namespace

class Metrics::PoolCollector : public prometheus::Collectable {
 public:
  PoolCollector(KvStore* store, bool name_all_tenants)
      : store_(store), name_all_tenants_(name_all_tenants) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    auto capacity = GaugeFamily("kvc_pool_capacity_bytes", "Block memory configured per pool.");
    // The device as a label of its own series (an info metric), so that ratios of the pool
    // gauges keep matching on `pool` alone.
    auto info =
        GaugeFamily("kvc_pool_info", "1 per pool; device: where its blocks live (cpu, cuda:N).");
    auto used = GaugeFamily("kvc_pool_used_bytes", "Bytes of blocks in use, by storage format.");
    auto free = GaugeFamily("kvc_pool_free_bytes", "Bytes of free blocks.");
    auto blocks = GaugeFamily("kvc_pool_blocks", "Blocks by state (used, free).");
    auto sequences = GaugeFamily("kvc_sequences", "Live sequences.");
    auto visible = GaugeFamily("kvc_visible_tokens",
                               "Logical tokens of live sequences (every token ever appended).");
    auto stored = GaugeFamily("kvc_stored_token_heads",
                              "Tokens actually stored, counted per kv head and layer.");
    auto ratio = GaugeFamily("kvc_compression_ratio",
                             "Dense bytes of the visible tokens / bytes held (1 = no saving).");
    PrefixFamilies prefix;
    LeaseFamilies leases;
    auto free_resident = GaugeFamily(
        "kvc_pool_free_resident_bytes",
        "Bytes of free blocks whose pages stay resident for reuse (host pools; keep_free_bytes).");
    auto released = CounterFamily("kvc_pool_released_bytes_total",
                                  "Bytes of free blocks' pages returned to the OS (host pools).");
    prometheus::MetricFamily evicted;
    evicted.name = "kvc_evicted_tokens_total";
    evicted.help = "Token-heads evicted, by what evicted them.";
    evicted.type = prometheus::MetricType::Counter;
    for (const PoolSnapshot& pool : store_->stats().ListPools()) {
      auto stats = store_->stats().GetPoolStats(pool.options.name);
      if (!stats.ok()) continue;
      const std::string& name = pool.options.name;
      AddSample(&capacity, {{"pool", name}}, static_cast<double>(stats->capacity_bytes));
      AddSample(&info, {{"pool", name}, {"device", pool.options.device}}, 1.0);
      for (const FormatBytes& fb : stats->bytes_by_format) {
        AddSample(&used, {{"pool", name}, {"format", kernels::StorageFormatName(fb.format)}},
                  static_cast<double>(fb.bytes));
      }
      if (stats->bytes_by_format.empty()) {
        AddSample(&used,
                  {{"pool", name},
                   {"format", kernels::StorageFormatName(
                                  kernels::RawFormatFor(pool.options.geometry.dtype))}},
                  0);
      }
      AddSample(&free, {{"pool", name}},
                static_cast<double>(stats->capacity_bytes - stats->used_bytes));
      AddSample(&blocks, {{"pool", name}, {"state", "used"}},
                static_cast<double>(stats->used_blocks));
      AddSample(&blocks, {{"pool", name}, {"state", "free"}},
                static_cast<double>(stats->total_blocks - stats->used_blocks));
      AddSample(&free_resident, {{"pool", name}}, static_cast<double>(stats->free_resident_bytes));
      AddSample(&released, {{"pool", name}}, static_cast<double>(stats->released_bytes_total));
      AddSample(&sequences, {{"pool", name}}, static_cast<double>(stats->sequences));
      AddSample(&visible, {{"pool", name}}, static_cast<double>(stats->visible_tokens));
      AddSample(&stored, {{"pool", name}}, static_cast<double>(stats->stored_token_heads));
      AddSample(&ratio, {{"pool", name}},
                stats->used_bytes > 0 ? static_cast<double>(stats->dense_bytes) /
                                            static_cast<double>(stats->used_bytes)
                                      : 1.0);
      for (const auto& [policy, n] : stats->evicted_token_heads) {
        AddSample(&evicted, {{"pool", name}, {"policy", policy}}, static_cast<double>(n));
      }
      prefix.Add(name, stats->prefix_cache);
      leases.Add(name, stats->leases);
    }
    std::vector<prometheus::MetricFamily> families{capacity, info,          used,     free,
                                                   blocks,   free_resident, released, sequences,
                                                   visible,  stored,        ratio,    evicted};
    families.push_back(ResidentFamily());
    prefix.AppendTo(&families);
    leases.AppendTo(&families);
    CollectTenants(&families);
    return families;
  }

 private:
  std::string TenantLabel(const std::string& tenant) const {
    if (name_all_tenants_) return tenant;
    for (const TenantQuota& q : store_->stats().quotas()) {
      if (q.tenant == tenant) return tenant;
    }
    return "_other";
  }

  void CollectTenants(std::vector<prometheus::MetricFamily>* families) const {
    auto sequences = GaugeFamily("kvc_tenant_sequences", "Live sequences, by tenant.");
    auto bytes = GaugeFamily(
        "kvc_tenant_used_bytes",
        "Block bytes a tenant holds (its sequences' and those only its leases pin), by pool.");
    auto lease_only = GaugeFamily("kvc_tenant_lease_only_bytes",
                                  "Of kvc_tenant_used_bytes: blocks only the tenant's leases pin.");
    auto quota_bytes =
        GaugeFamily("kvc_tenant_quota_bytes", "A tenant's max_bytes_per_pool (0 = unlimited).");
    auto quota_sequences =
        GaugeFamily("kvc_tenant_quota_sequences", "A tenant's max_sequences (0 = unlimited).");
    const std::vector<PoolSnapshot> pools = store_->stats().ListPools();
    // Summed by label: several unnamed tenants share "_other".
    std::map<std::string, std::pair<int64_t, std::vector<int64_t>>> by_label;
    std::map<std::string, TenantQuota> quotas;
    std::map<std::string, std::vector<int64_t>> leased_by_label;
    for (const TenantUsageSnapshot& t : store_->stats().TenantUsage()) {
      const std::string label = TenantLabel(t.tenant);
      auto& [seqs, pool_bytes] = by_label[label];
      pool_bytes.resize(pools.size());
      seqs += t.sequences;
      for (size_t i = 0; i < pools.size() && i < t.pool_bytes.size(); ++i) {
        pool_bytes[i] += t.pool_bytes[i];
      }
      std::vector<int64_t>& leased = leased_by_label[label];
      leased.resize(pools.size());
      for (size_t i = 0; i < pools.size() && i < t.lease_only_bytes.size(); ++i) {
        leased[i] += t.lease_only_bytes[i];
      }
      if (label != "_other") quotas[label] = t.quota;
    }
    // Tenants with a quota entry are shown even while they hold nothing.
    for (const TenantQuota& q : store_->stats().quotas()) {
      if (q.tenant == "*") continue;
      by_label[q.tenant].second.resize(pools.size());
      quotas[q.tenant] = q;
    }
    for (const auto& [label, usage] : by_label) {
      AddSample(&sequences, {{"tenant", label}}, static_cast<double>(usage.first));
      for (size_t i = 0; i < pools.size(); ++i) {
        AddSample(&bytes, {{"tenant", label}, {"pool", pools[i].options.name}},
                  static_cast<double>(usage.second[i]));
      }
    }
    for (const auto& [label, leased] : leased_by_label) {
      for (size_t i = 0; i < pools.size(); ++i) {
        if (leased[i] == 0) continue;  // only tenants that have some: no series per tenant
        AddSample(&lease_only, {{"tenant", label}, {"pool", pools[i].options.name}},
                  static_cast<double>(leased[i]));
      }
    }
    for (const auto& [label, q] : quotas) {
      AddSample(&quota_bytes, {{"tenant", label}}, static_cast<double>(q.max_bytes_per_pool));
      AddSample(&quota_sequences, {{"tenant", label}}, static_cast<double>(q.max_sequences));
    }
    families->push_back(std::move(sequences));
    families->push_back(std::move(bytes));
    families->push_back(std::move(lease_only));
    families->push_back(std::move(quota_bytes));
    families->push_back(std::move(quota_sequences));
  }

  KvStore* store_;
  bool name_all_tenants_;
};

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& listen, KvStore* store,
                                                         bool name_all_tenants) {
  std::unique_ptr<Metrics> m(new Metrics());
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->pools_ = std::make_shared<PoolCollector>(store, name_all_tenants);
  m->requests_ = &prometheus::BuildCounter()
                      .Name("kvc_rpc_requests_total")
                      .Help("RPCs finished, by service, method and gRPC status code.")
                      .Register(*m->registry_);
  m->duration_ = &prometheus::BuildHistogram()
                      .Name("kvc_rpc_duration_seconds")
                      .Help("RPC handling time in the server, by service and method.")
                      .Register(*m->registry_);
  m->received_ = &prometheus::BuildCounter()
                      .Name("kvc_rpc_received_bytes_total")
                      .Help("KV payload bytes received (Append), by method.")
                      .Register(*m->registry_);
  m->sent_ = &prometheus::BuildCounter()
                  .Name("kvc_rpc_sent_bytes_total")
                  .Help("KV payload bytes sent (Fetch), by method.")
                  .Register(*m->registry_);
  m->draining_ = &prometheus::BuildGauge()
                      .Name("kvc_draining")
                      .Help("1 while kvcached is draining before shutdown.")
                      .Register(*m->registry_)
                      .Add({});
  // Who this server is in a cluster, as an info metric: dashboards join it on `instance` for
  // a per-shard view, and a changed incarnation shows a restart that lost every sequence.
  prometheus::BuildGauge()
      .Name("kvc_shard_info")
      .Help("1; shard: cluster name (empty = not a shard); incarnation: drawn at each start.")
      .Register(*m->registry_)
      .Add({{"shard", store->stats().shard().name()},
            {"incarnation", store->stats().shard().incarnation()}})
      .Set(1);
  m->auth_failures_ = &prometheus::BuildCounter()
                           .Name("kvc_auth_failures_total")
                           .Help("Calls refused for missing or invalid credentials.")
                           .Register(*m->registry_)
                           .Add({});
  m->local_socket_ = &prometheus::BuildCounter()
                          .Name("kvc_local_socket_events_total")
                          .Help(
                              "Same-node socket events: connected, refused (uid not allowed, "
                              "too many readers, bad token), authenticated, revoked (closed: "
                              "its token no longer authenticates), arena, segment (a segment's "
                              "fd handed out), staging (a staging region opened).")
                          .Register(*m->registry_);
  for (const char* event :
       {"connected", "refused", "authenticated", "revoked", "arena", "segment", "staging"})
    m->local_socket_->Add({{"event", event}});
  m->transfer_events_ = &prometheus::BuildCounter()
                             .Name("kvc_transfer_events_total")
                             .Help(
                                 "Transfer channel events: opened, connected, refused (bad "
                                 "greeting, wrong token, none in time), sent (a lease's "
                                 "blocks), received (an Append's keys and values, NCCL), "
                                 "failed (a send or receive that failed), closed.")
                             .Register(*m->registry_);
  for (const char* event :
       {"opened", "connected", "refused", "sent", "received", "failed", "closed"})
    m->transfer_events_->Add({{"event", event}});
  m->transfer_bytes_ = &prometheus::BuildCounter()
                            .Name("kvc_transfer_bytes_total")
                            .Help("Payload bytes of leased blocks sent over transfer channels.")
                            .Register(*m->registry_)
                            .Add({});
  m->quota_refusals_ = &prometheus::BuildCounter()
                            .Name("kvc_tenant_call_limit_refusals_total")
                            .Help("Calls refused by a tenant's max_streams / max_compute_calls.")
                            .Register(*m->registry_);
  prometheus::BuildGauge()
      .Name("kvc_build_info")
      .Help("Build information; always 1.")
      .Register(*m->registry_)
      .Add({{"version", "0.1.0"}})
      .Set(1);
  if (!listen.empty()) {
    try {
      m->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(
          "cannot serve metrics on '", listen, "': ", e.what(), "; pick another --metrics_listen"));
    }
    m->exposer_->RegisterCollectable(m->registry_);
    m->exposer_->RegisterCollectable(m->pools_);
    const auto ports = m->exposer_->GetListeningPorts();
    const auto colon = listen.rfind(':');
    m->address_ = absl::StrCat(listen.substr(0, colon), ":", ports.empty() ? 0 : ports.front());
  }
  return m;
}

Metrics::~Metrics() = default;

namespace {

const std::vector<double>& LatencyBuckets() {
  // 50 us .. 10 s: unary calls take ~100 us on loopback, large fetches seconds.
  static const std::vector<double> kBuckets = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                               0.005,   0.01,   0.025,   0.05,   0.1,   0.25,
                                               0.5,     1,      2.5,     5,      10};
  return kBuckets;
}

}  // namespace

void Metrics::RecordRpc(const char* service, const char* method, const char* code_name,
                        double seconds, int64_t received_bytes, int64_t sent_bytes) {
  requests_->Add({{"service", service}, {"method", method}, {"code", code_name}}).Increment();
  duration_->Add({{"service", service}, {"method", method}}, LatencyBuckets()).Observe(seconds);
  if (received_bytes > 0) {
    received_->Add({{"method", method}}).Increment(static_cast<double>(received_bytes));
  }
  if (sent_bytes > 0) sent_->Add({{"method", method}}).Increment(static_cast<double>(sent_bytes));
}

void Metrics::RecordAuthFailure() { auth_failures_->Increment(); }

void Metrics::RecordLocalSocketEvent(const char* event) {
  local_socket_->Add({{"event", event}}).Increment();
}

void Metrics::RecordTransferEvent(const char* event) {
  transfer_events_->Add({{"event", event}}).Increment();
}

void Metrics::RecordTransferBytes(int64_t bytes) {
  transfer_bytes_->Increment(static_cast<double>(bytes));
}

void Metrics::RecordQuotaRefusal(const std::string& tenant, const char* limit) {
  quota_refusals_->Add({{"tenant", tenant}, {"limit", limit}}).Increment();
}

void Metrics::SetDraining(bool draining) { draining_->Set(draining ? 1 : 0); }

std::string Metrics::Serialize() const {
  auto families = registry_->Collect();
  auto pools = pools_->Collect();
  families.insert(families.end(), pools.begin(), pools.end());
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace kvc::cachesvc
