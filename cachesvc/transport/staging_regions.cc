#include "cachesvc/transport/staging_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/random_id.h"

namespace kvc::cachesvc {

absl::StatusOr<std::shared_ptr<StagingRegion>> StagingRegion::Create(int64_t bytes) {
  const auto failed = [bytes](const char* what) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot make a staging region of ", bytes,
                                                     " bytes: ", what, ": ",
                                                     std::generic_category().message(errno)));
  };
  const int fd = ::memfd_create("kvc-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return failed("memfd_create");
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    auto status = failed("sizing and sealing");
    ::close(fd);
    return status;
  }
  // Read-only here: the server never writes a staged byte.
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    auto status = failed("mmap");
    ::close(fd);
    return status;
  }
  return std::shared_ptr<StagingRegion>(
      new StagingRegion(static_cast<const uint8_t*>(p), bytes, fd));
}

StagingRegion::~StagingRegion() {
  ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(bytes_));
  ::close(fd_);
}

absl::StatusOr<std::pair<std::string, std::shared_ptr<StagingRegion>>> StagingRegions::Open(
    int64_t bytes, const TenantScope& scope) {
  if (bytes < kMinBytes || bytes > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a staging region of ", bytes, " bytes; expected ", kMinBytes, " .. ", kMaxBytes));
  }
  {
    // Checked before the memfd exists; charged below under the same rule, so two Opens
    // racing cannot both pass it.
    absl::MutexLock lock(&mu_);
    const auto it = scope_bytes_.find(scope);
    const int64_t held = it == scope_bytes_.end() ? 0 : it->second;
    if (held + bytes > budget_per_scope_ || open_bytes_ + bytes > budget_total_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a staging region of ", bytes, " bytes would pass the staging budget (",
          held + bytes > budget_per_scope_
              ? absl::StrCat(held, " of this tenant's ", budget_per_scope_, " bytes in use")
              : absl::StrCat(open_bytes_, " of the server's ", budget_total_, " bytes in use"),
          "): close regions it does not use or ask for a smaller one"));
    }
    scope_bytes_[scope] += bytes;
    open_bytes_ += bytes;
  }
  const auto unreserve = [&] {
    absl::MutexLock lock(&mu_);
    if ((scope_bytes_[scope] -= bytes) == 0) scope_bytes_.erase(scope);
    open_bytes_ -= bytes;
  };
  std::string id = RandomId("");
  absl::StatusOr<std::shared_ptr<StagingRegion>> region = StagingRegion::Create(bytes);
  if (!region.ok()) {
    unreserve();
    return region.status();
  }
  absl::MutexLock lock(&mu_);
  regions_[id] = OpenRegion{*region, scope};
  return std::make_pair(std::move(id), *std::move(region));
}

void StagingRegions::Close(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) return;
  const int64_t bytes = it->second.region->bytes();
  open_bytes_ -= bytes;
  if ((scope_bytes_[it->second.scope] -= bytes) == 0) scope_bytes_.erase(it->second.scope);
  regions_.erase(it);
}

absl::StatusOr<std::shared_ptr<const StagingRegion>> StagingRegions::Find(
    const TenantScope& scope, const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(id);
  if (it == regions_.end() || it->second.scope != scope) {
    return absl::FailedPreconditionError(
        absl::StrCat("staging region '", id.substr(0, 40),
                     "' is not open on this server (the local-socket connection that opened it "
                     "has closed, or the server restarted): open another one"));
  }
  return std::shared_ptr<const StagingRegion>(it->second.region);
}

int64_t StagingRegions::open_bytes() const {
  absl::MutexLock lock(&mu_);
  return open_bytes_;
}

}  // namespace kvc::cachesvc
