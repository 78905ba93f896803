// KvCacheClient::Impl: the client's channel, stubs and same-node state, shared by
// kv_cache_client.cc, the append streams (append_streams.h) and AdminClient (admin_client.cc),
// which makes its unary calls through Impl::Call as the client does.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/channel/channel.h"
#include "client/src/local_reader.h"
#include "client/src/read_path.h"
#include "client/src/staging_space.h"
#include "common/mutex.h"
#include "kvc/client/kv_cache_client.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "proto/rpc_status.h"

namespace kvc::client {

struct KvCacheClient::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<::kvcache::v1::KvCacheService::Stub> kv;
  std::unique_ptr<::kvcache::v1::AdminService::Stub> admin;

  // The read path (read_path.h) and the selector's state (data_paths.cc): decided on the
  // first Fetch, and again after the path broke. Shared: a call keeps the path it started
  // with even if a later call drops it (the server restarted) and decides again.
  kvc::Mutex local_mu;
  bool local_decided ABSL_GUARDED_BY(local_mu) = false;
  std::shared_ptr<internal::ReadPath> reads ABSL_GUARDED_BY(local_mu);  // null: gRPC
  // Set when `reads` is the same-node path: its connection also opens staging regions and
  // shares device arenas.
  std::shared_ptr<internal::LocalReader> local ABSL_GUARDED_BY(local_mu);
  std::string data_path ABSL_GUARDED_BY(local_mu) = "grpc (no Fetch yet)";
  // The gRPC path: always there, and where a call goes when the decided path cannot serve it.
  std::shared_ptr<internal::ReadPath> grpc_reads;
  // Appends' staging region (staging_space.h), decided on the first Append.
  bool staging_decided ABSL_GUARDED_BY(local_mu) = false;
  std::shared_ptr<internal::StagingSpace> staging ABSL_GUARDED_BY(local_mu);
  std::string append_path ABSL_GUARDED_BY(local_mu) = "grpc (no Append yet)";

  // Whether a unary call may be sent again after UNAVAILABLE: only calls that change nothing
  // or change it the same way twice (a lost reply of Create or Compress must not repeat).
  enum class Retried { kNo, kYes };
  // One unary call, `method` of the KvCacheService or AdminService stub, with a fresh context
  // (deadline, credentials) per attempt: the shape every unary method of the client shares.
  template <typename Stub, typename Request, typename Response>
  absl::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response, const CallOptions& call,
                    Retried retried) const {
    Stub* stub = StubFor(static_cast<Stub*>(nullptr));
    const auto attempt = [&] {
      grpc::ClientContext context;
      Prepare(&context, call);
      return FromGrpcStatus((stub->*method)(&context, request, response));
    };
    if (retried == Retried::kNo) return attempt();
    return Retry(attempt);
  }
  ::kvcache::v1::KvCacheService::Stub* StubFor(::kvcache::v1::KvCacheService::Stub*) const {
    return kv.get();
  }
  ::kvcache::v1::AdminService::Stub* StubFor(::kvcache::v1::AdminService::Stub*) const {
    return admin.get();
  }

  void Prepare(grpc::ClientContext* context, const CallOptions& call) const {
    const absl::Duration deadline =
        call.deadline > absl::ZeroDuration() ? call.deadline : options.default_deadline;
    context->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    internal::AddCallCredentials(options, context);
  }

  // Runs `attempt` (which must build a fresh ClientContext each time) and retries it on
  // UNAVAILABLE with exponential backoff while `retryable()` still holds. Only for idempotent
  // calls.
  template <typename Fn, typename Pred>
  absl::Status Retry(Fn&& attempt, Pred&& retryable) const {
    absl::Duration backoff = options.initial_backoff;
    absl::Status status;
    for (int i = 0; i < options.max_attempts; ++i) {
      status = attempt();
      if (status.code() != absl::StatusCode::kUnavailable || i + 1 == options.max_attempts ||
          !retryable()) {
        break;
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, options.max_backoff);
    }
    return status;
  }
  template <typename Fn>
  absl::Status Retry(Fn&& attempt) const {
    return Retry(std::forward<Fn>(attempt), [] { return true; });
  }
};

using StubKv = ::kvcache::v1::KvCacheService::Stub;
using StubAdmin = ::kvcache::v1::AdminService::Stub;
using Retried = KvCacheClient::Impl::Retried;

namespace internal {

// A client's state with its channel and stubs made (KvCacheClient::Connect and
// AdminClient::Connect): INVALID_ARGUMENT for bad options or an unreadable TLS file.
absl::StatusOr<std::unique_ptr<KvCacheClient::Impl>> NewImpl(const ClientOptions& options);

// The data-path selector (data_paths.cc). ReadPathFor: the read path Fetch and FetchInto take
// (read_path.h), decided on first use and again after it broke; never null (gRPC when nothing
// else). LocalPath: the same-node reader when that is the read path; null otherwise.
// LocalStaging: the staging region Appends use, when this client may use one (decided with
// LocalPath); null: gRPC.
std::shared_ptr<ReadPath> ReadPathFor(KvCacheClient& client, KvCacheClient::Impl& impl,
                                      const CallOptions& call);
std::shared_ptr<LocalReader> LocalPath(KvCacheClient& client, KvCacheClient::Impl& impl,
                                       const CallOptions& call);
std::shared_ptr<StagingSpace> LocalStaging(KvCacheClient& client, KvCacheClient::Impl& impl,
                                           const CallOptions& call);

}  // namespace internal
}  // namespace kvc::client
