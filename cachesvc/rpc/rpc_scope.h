// RpcScope: times one RPC and records it in Metrics (if any) when the handler finishes.
//   RpcScope scope(metrics_, "KvCacheService", "Append");
//   return scope.Finish(status);
#pragma once

#include <grpcpp/support/status.h>

#include <chrono>
#include <cstdint>

#include "cachesvc/metrics/metrics.h"

namespace kvc::cachesvc {

// gRPC status code name as Prometheus labels and logs show it ("OK", "NOT_FOUND").
const char* GrpcCodeName(grpc::StatusCode code);

class RpcScope {
 public:
  RpcScope(Metrics* metrics, const char* service, const char* method)
      : metrics_(metrics),
        service_(service),
        method_(method),
        start_(std::chrono::steady_clock::now()) {}
  RpcScope(const RpcScope&) = delete;
  RpcScope& operator=(const RpcScope&) = delete;
  ~RpcScope() = default;

  void AddReceived(int64_t bytes) { received_ += bytes; }
  void AddSent(int64_t bytes) { sent_ += bytes; }

  grpc::Status Finish(grpc::Status status) {
    if (metrics_ != nullptr) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      metrics_->RecordRpc(service_, method_, GrpcCodeName(status.error_code()), seconds, received_,
                          sent_);
    }
    return status;
  }

 private:
  Metrics* metrics_;
  const char* service_;
  const char* method_;
  std::chrono::steady_clock::time_point start_;
  int64_t received_ = 0;
  int64_t sent_ = 0;
};

}  // namespace kvc::cachesvc
