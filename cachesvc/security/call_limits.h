// CallLimits: per-tenant caps on calls in flight (TenantQuota.max_streams for AppendStream,
// Fetch and AttendStream; max_compute_calls for Attend and Compress). A slot is taken before
// the call does any work and given back when the handler returns, by RAII, so a cancelled or
// failed call cannot leak one. Only authenticated tenants are limited: without
// authentication there is no trustworthy tenant to count against.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/tenant/tenant_quota.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

enum class CallKind { kStream, kCompute };

class CallLimits {
 public:
  explicit CallLimits(std::vector<TenantQuota> quotas) : quotas_(std::move(quotas)) {}

  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept : count_(other.count_) { other.count_ = nullptr; }
    Slot& operator=(Slot&&) = delete;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() {
      if (count_ != nullptr) count_->fetch_sub(1);
    }

   private:
    friend class CallLimits;
    explicit Slot(std::atomic<int>* count) : count_(count) {}
    std::atomic<int>* count_ = nullptr;
  };

  // A slot for one call of `tenant`, or RESOURCE_EXHAUSTED naming the limit. An empty
  // tenant (authentication off) is never limited.
  absl::StatusOr<Slot> Acquire(const std::string& tenant, CallKind kind);
  // Calls of this kind `tenant` has open now.
  int InFlight(const std::string& tenant, CallKind kind) const;

 private:
  struct Counts {
    TenantQuota quota;
    std::atomic<int> streams{0};
    std::atomic<int> compute{0};
  };
  Counts* CountsFor(const std::string& tenant);

  const std::vector<TenantQuota> quotas_;
  mutable kvc::Mutex mu_;
  // Entries are never removed: tenants are authenticated, so they come from the bounded set
  // of configured credentials.
  absl::flat_hash_map<std::string, std::unique_ptr<Counts>> counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc::cachesvc
