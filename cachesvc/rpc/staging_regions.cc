#include "cachesvc/rpc/staging_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/token_hash.h"

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
    int64_t bytes) {
  if (bytes < kMinBytes || bytes > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a staging region of ", bytes, " bytes; expected ", kMinBytes, " .. ", kMaxBytes));
  }
  absl::StatusOr<std::string> random = RandomBytes(16);
  if (!random.ok()) return random.status();
  std::string id = ToHex(*random);
  absl::StatusOr<std::shared_ptr<StagingRegion>> region = StagingRegion::Create(bytes);
  if (!region.ok()) return region.status();
  absl::MutexLock lock(&mu_);
  regions_[id] = *region;
  open_bytes_ += bytes;
  return std::make_pair(std::move(id), *std::move(region));
}

void StagingRegions::Close(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) return;
  open_bytes_ -= it->second->bytes();
  regions_.erase(it);
}

absl::StatusOr<std::shared_ptr<const StagingRegion>> StagingRegions::Find(
    const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("staging region '", id.substr(0, 40),
                     "' is not open on this server (the local-socket connection that opened it "
                     "has closed, or the server restarted): open another one"));
  }
  return std::shared_ptr<const StagingRegion>(it->second);
}

int64_t StagingRegions::open_bytes() const {
  absl::MutexLock lock(&mu_);
  return open_bytes_;
}

}  // namespace kvc::cachesvc
