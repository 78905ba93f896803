#include "client/src/cluster/endpoint.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/channel/channel.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvc/client/admin_client.h"
#include "proto/rpc_status.h"

namespace kvc::client::internal {

namespace health = ::grpc::health::v1;

absl::StatusOr<std::shared_ptr<Endpoint>> Endpoint::Create(const std::string& address,
                                                           const ClusterOptions& options) {
  ClientOptions client_options = options.client;
  client_options.target = address;
  auto client = KvCacheClient::Connect(client_options);
  if (!client.ok()) return client.status();
  // Same target and arguments as the data client's channel: gRPC shares the connection.
  auto health = CreateChannel(client_options);
  if (!health.ok()) return health.status();
  std::shared_ptr<Endpoint> endpoint(new Endpoint(
      address, options, std::shared_ptr<KvCacheClient>(std::move(*client)), *std::move(health)));
  endpoint->thread_ = std::thread([raw = endpoint.get()] { raw->WatchLoop(); });
  return endpoint;
}

Endpoint::Endpoint(std::string address, const ClusterOptions& options,
                   std::shared_ptr<KvCacheClient> client,
                   const std::shared_ptr<grpc::Channel>& health)
    : address_(std::move(address)),
      options_(options),
      client_(std::move(client)),
      health_stub_(health::Health::NewStub(health)) {}

Endpoint::~Endpoint() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (watch_context_ != nullptr) watch_context_->TryCancel();
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Endpoint::SleepUnlessStopped(absl::Duration d) {
  std::unique_lock<std::mutex> lock(mu_);
  stop_cv_.wait_for(lock, absl::ToChronoNanoseconds(d), [this] { return stop_; });
  return !stop_;
}

void Endpoint::WatchLoop() {
  absl::Duration backoff = absl::Milliseconds(50);
  const absl::Duration max_backoff = std::max(options_.probe_interval, absl::Milliseconds(500));
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    // Who answers here now. A new incarnation is a restarted process holding none of the
    // earlier sequences: routing compares it with the incarnation each id carries.
    auto info = AdminClient::Over(*client_).GetServerInfo({options_.health_timeout});
    if (!info.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        view_.last_error = std::string(info.status().message());
      }
      if (!SleepUnlessStopped(backoff)) return;
      backoff = std::min(backoff * 2, max_backoff);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!view_.incarnation.empty() && view_.incarnation != info->incarnation) {
        ++restarts_seen_;
      }
      view_.shard = info->shard;
      view_.incarnation = info->incarnation;
      view_.weight = info->weight;
      view_.identified = true;
      view_.serving = !info->draining;
    }
    grpc::ClientContext context;
    ClientOptions call_options = options_.client;
    AddCallCredentials(call_options, &context);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      watch_context_ = &context;
    }
    health::HealthCheckRequest request;  // service "": the whole server
    std::unique_ptr<grpc::ClientReader<health::HealthCheckResponse>> reader =
        health_stub_->Watch(&context, request);
    health::HealthCheckResponse response;
    bool draining = false;
    while (reader->Read(&response)) {
      std::lock_guard<std::mutex> lock(mu_);
      view_.connected = true;
      view_.serving = response.status() == health::HealthCheckResponse::SERVING;
      backoff = absl::Milliseconds(50);
      if (!view_.serving) {
        // An open Watch is a call in flight, and a shutting-down server waits for every call
        // in flight: holding it would keep a drained kvcached alive for its whole grace period.
        // Poll instead while the shard drains.
        draining = true;
        context.TryCancel();
      }
    }
    const grpc::Status finished = reader->Finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      watch_context_ = nullptr;
      if (stop_) return;
    }
    if (draining && PollWhileDraining()) continue;  // serving again: watch again
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The process is gone (or unreachable): nothing is routed here until it answers again,
      // and then only ids of the incarnation that answers.
      view_.connected = false;
      view_.serving = false;
      view_.identified = false;
      view_.down_since = absl::Now();
      if (!draining) {
        view_.last_error = finished.error_message().empty()
                               ? std::string("health watch ended")
                               : absl::StrCat("health watch: ", finished.error_message());
      }
    }
    if (!SleepUnlessStopped(backoff)) return;
    backoff = std::min(backoff * 2, max_backoff);
  }
}

grpc::Status Endpoint::CheckHealth(health::HealthCheckResponse* response) const {
  grpc::ClientContext context;
  AddCallCredentials(options_.client, &context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.health_timeout));
  return health_stub_->Check(&context, health::HealthCheckRequest(), response);
}

bool Endpoint::PollWhileDraining() {
  while (SleepUnlessStopped(options_.probe_interval)) {
    health::HealthCheckResponse response;
    const grpc::Status s = CheckHealth(&response);
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok()) {
      view_.last_error = absl::StrCat("health check while draining: ", s.error_message());
      return false;
    }
    if (response.status() == health::HealthCheckResponse::SERVING) return true;
  }
  return false;
}

Endpoint::View Endpoint::view(absl::Time now) const {
  std::lock_guard<std::mutex> lock(mu_);
  View v = view_;
  v.ejected = now < ejected_until_;
  return v;
}

ShardStatus Endpoint::status(absl::Time now) const {
  std::lock_guard<std::mutex> lock(mu_);
  ShardStatus s;
  s.address = address_;
  s.shard = view_.shard;
  s.incarnation = view_.incarnation;
  s.weight = view_.weight;
  if (now < ejected_until_) {
    s.state = ShardState::kEjected;
  } else if (!view_.connected || !view_.identified) {
    s.state = ShardState::kConnecting;
  } else {
    s.state = view_.serving ? ShardState::kServing : ShardState::kDraining;
  }
  s.listed = listed_;
  s.calls = calls_;
  s.failures = failures_;
  s.ejections = ejections_;
  s.restarts_seen = restarts_seen_;
  s.last_error = view_.last_error;
  return s;
}

void Endpoint::CountCall() {
  std::lock_guard<std::mutex> lock(mu_);
  ++calls_;
}

void Endpoint::Report(const absl::Status& status) {
  const bool shard_failure = status.code() == absl::StatusCode::kUnavailable ||
                             status.code() == absl::StatusCode::kDeadlineExceeded;
  std::lock_guard<std::mutex> lock(mu_);
  if (!shard_failure) {
    view_.failures_in_row = 0;
    return;
  }
  ++failures_;
  view_.last_error = std::string(status.message());
  if (++view_.failures_in_row >= options_.eject_after_failures) {
    Eject(absl::Now(), std::string(status.message()));
  }
}

// Requires mu_.
void Endpoint::Eject(absl::Time now, const std::string& why) {
  absl::Duration d = options_.eject_time;
  for (int i = 0; i < ejections_in_row_ && d < options_.max_eject_time; ++i) d *= 2;
  ejected_until_ = now + std::min(d, options_.max_eject_time);
  ++ejections_in_row_;
  ++ejections_;
  view_.failures_in_row = 0;
  view_.last_error = absl::StrCat("ejected: ", why);
}

void Endpoint::set_listed(bool listed) {
  std::lock_guard<std::mutex> lock(mu_);
  listed_ = listed;
}

bool Endpoint::listed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return listed_;
}

void Endpoint::ProbeIfDue(absl::Time now) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ejections_in_row_ == 0 || now < ejected_until_) return;
  }
  health::HealthCheckResponse response;
  const grpc::Status s = CheckHealth(&response);
  std::lock_guard<std::mutex> lock(mu_);
  // Any answer readmits: the process responds again. (Whether it takes new sequences is the
  // watch's business: a draining shard still serves the sequences it holds.)
  if (s.ok()) {
    ejections_in_row_ = 0;  // the next ejection starts from eject_time again
    ejected_until_ = absl::InfinitePast();
    return;
  }
  Eject(absl::Now(), absl::StrCat("health check: ", s.error_message()));
  --ejections_;  // the same outage, not a new ejection
}

}  // namespace kvc::client::internal
