#include "cachesvc/security/call_limits.h"

#include "absl/strings/str_cat.h"

namespace kvc::cachesvc {

CallLimits::Counts* CallLimits::CountsFor(const std::string& tenant) {
  kvc::MutexLock lock(&mu_);
  std::unique_ptr<Counts>& slot = counts_[tenant];
  if (slot == nullptr) {
    slot = std::make_unique<Counts>();
    slot->quota = QuotaFor(quotas_, tenant);
  }
  return slot.get();
}

absl::StatusOr<CallLimits::Slot> CallLimits::Acquire(const std::string& tenant, CallKind kind) {
  if (tenant.empty()) return Slot();
  Counts* counts = CountsFor(tenant);
  const bool stream = kind == CallKind::kStream;
  std::atomic<int>& count = stream ? counts->streams : counts->compute;
  const int limit = stream ? counts->quota.max_streams : counts->quota.max_compute_calls;
  int now = count.load();
  do {
    if (limit > 0 && now >= limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant '", tenant, "' has ", now,
          stream ? " streams open (AppendStream, Fetch, AttendStream), its quota (max_streams "
                 : " Attend/Compress calls in flight, its quota (max_compute_calls ",
          limit, "); retry when one finishes"));
    }
  } while (!count.compare_exchange_weak(now, now + 1));
  return Slot(&count);
}

int CallLimits::InFlight(const std::string& tenant, CallKind kind) const {
  kvc::MutexLock lock(&mu_);
  auto it = counts_.find(tenant);
  if (it == counts_.end()) return 0;
  return kind == CallKind::kStream ? it->second->streams.load() : it->second->compute.load();
}

}  // namespace kvc::cachesvc
