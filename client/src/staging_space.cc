#include "client/src/staging_space.h"

#include <sys/mman.h>

namespace kvc::client::internal {

StagingSpace::~StagingSpace() { ::munmap(base_, static_cast<size_t>(bytes_)); }

std::optional<StagingSpace::Slot> StagingSpace::Acquire(int64_t bytes) {
  const int64_t want = (bytes + 63) / 64 * 64;
  if (want <= 0 || want > bytes_) return std::nullopt;
  kvc::MutexLock lock(&mu_);
  // First fit over the gaps between used runs (a handful: one per Append in flight).
  int64_t at = 0;
  for (const auto& [offset, length] : used_) {
    if (offset - at >= want) break;
    at = offset + length;
  }
  if (bytes_ - at < want) return std::nullopt;
  used_.emplace(at, want);
  return Slot(this, at);
}

void StagingSpace::Release(int64_t offset) {
  kvc::MutexLock lock(&mu_);
  used_.erase(offset);
}

}  // namespace kvc::client::internal
