#include "cachesvc/core/pool/host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/errno_message.h"

namespace kvc::cachesvc {
namespace {

// A read-only descriptor of `fd` that nobody but kvcached's uid (or root) can turn into a
// writable one: the memfd's mode drops to 0400 first, and reopening checks the mode. -1 when
// /proc is not there.
int ReadOnlyReopen(int fd) {
  if (::fchmod(fd, 0400) != 0) return -1;
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  return ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
}

// Whether this host gives memfds and read-only reopens of them (a sandbox may not).
bool MemfdsWork() {
  const int fd = ::memfd_create("kvc-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return false;
  const int ro = ReadOnlyReopen(fd);
  if (ro >= 0) ::close(ro);
  ::close(fd);
  return ro >= 0;
}

}  // namespace

absl::StatusOr<HostArena> HostArena::Reserve(size_t bytes, size_t segment_bytes, std::string name) {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  KVC_CHECK(segment_bytes > 0 && segment_bytes % page == 0 && bytes % segment_bytes == 0)
      << "segment_bytes " << segment_bytes << ", bytes " << bytes;
  HostArena arena;
  if (bytes == 0) return arena;
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot reserve ", bytes, " bytes of address space for the pool: ", ErrnoMessage()));
  }
  arena.data_ = static_cast<uint8_t*>(p);
  arena.size_ = bytes;
  arena.segment_bytes_ = segment_bytes;
  arena.name_ = std::move(name);
  arena.shareable_ = MemfdsWork();
  arena.fds_.assign(bytes / segment_bytes, -1);
  arena.claimed_.assign(bytes / segment_bytes, false);
  return arena;
}

HostArena::HostArena(HostArena&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      segment_bytes_(std::exchange(other.segment_bytes_, 0)),
      name_(std::move(other.name_)),
      shareable_(std::exchange(other.shareable_, false)),
      fds_(std::move(other.fds_)),
      claimed_(std::move(other.claimed_)) {}

HostArena& HostArena::operator=(HostArena&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    segment_bytes_ = std::exchange(other.segment_bytes_, 0);
    name_ = std::move(other.name_);
    shareable_ = std::exchange(other.shareable_, false);
    fds_ = std::move(other.fds_);
    claimed_ = std::move(other.claimed_);
  }
  return *this;
}

HostArena::~HostArena() { Reset(); }

absl::Status HostArena::Claim(int64_t segment) {
  const auto s = static_cast<size_t>(segment);
  KVC_CHECK(segment >= 0 && s < claimed_.size() && !claimed_[s]) << "segment " << segment;
  uint8_t* at = data_ + s * segment_bytes_;
  const auto fail = [&](const char* what) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot back ", segment_bytes_, " more bytes of the pool (", what, "): ", ErrnoMessage()));
  };
  if (!shareable_) {
    void* p = ::mmap(at, segment_bytes_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) return fail("mmap");
    claimed_[s] = true;
    return absl::OkStatus();
  }
  const int fd = ::memfd_create(name_.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return fail("memfd_create");
  if (::ftruncate(fd, static_cast<off_t>(segment_bytes_)) != 0) {
    ::close(fd);
    return fail("ftruncate");
  }
  // MAP_FIXED inside our own reservation: replaces its inaccessible pages, nothing else.
  void* p = ::mmap(at, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return fail("mmap");
  }
  const int read_only = ReadOnlyReopen(fd);
  // After our own writable mapping: nobody grows or shrinks it.
  if (read_only < 0 || ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    absl::Status status = fail("sealing");
    if (read_only >= 0) ::close(read_only);
    ::close(fd);
    ::mmap(at, segment_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
           -1, 0);
    return status;
  }
  // The mapping keeps the memfd alive; the read-only reopen is what readers get (and what
  // fstat counts pages on).
  ::close(fd);
  fds_[s] = read_only;
  claimed_[s] = true;
  return absl::OkStatus();
}

void HostArena::Unclaim(int64_t segment) {
  const auto s = static_cast<size_t>(segment);
  KVC_CHECK(segment >= 0 && s < claimed_.size() && claimed_[s]) << "segment " << segment;
  // Inaccessible again, and no longer this memfd's: our last reference to it goes with the
  // descriptor below (readers' mappings keep theirs).
  void* p = ::mmap(data_ + s * segment_bytes_, segment_bytes_, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  KVC_CHECK(p != MAP_FAILED) << "cannot unmap a pool segment: " << ErrnoMessage();
  if (fds_[s] >= 0) ::close(fds_[s]);
  fds_[s] = -1;
  claimed_[s] = false;
}

absl::StatusOr<UniqueFd> HostArena::ShareSegment(int64_t segment) const {
  const auto s = static_cast<size_t>(segment);
  if (segment < 0 || s >= fds_.size() || fds_[s] < 0) {
    return absl::FailedPreconditionError(
        shareable_ ? "the segment holds nothing now"
                   : "this host has no memfd: the pool's memory cannot be mapped by another "
                     "process");
  }
  const int fd = ::fcntl(fds_[s], F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("dup: ", ErrnoMessage()));
  return UniqueFd(fd);
}

absl::Status HostArena::ReleasePages(size_t offset, size_t length) {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (offset % page != 0 || length % page != 0 || offset > size_ || length > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("cannot release [", offset, ", +", length,
                                                   ") of an arena of ", size_, " bytes"));
  }
  if (length == 0) return absl::OkStatus();
  // A memfd's pages belong to the file: MADV_REMOVE punches them out of it (freeing them and
  // zeroing every mapping); MADV_DONTNEED would only unmap them here. Private anonymous
  // memory is the reverse.
  if (::madvise(data_ + offset, length, shareable_ ? MADV_REMOVE : MADV_DONTNEED) != 0) {
    return absl::InternalError(absl::StrCat("releasing pool pages: ", ErrnoMessage()));
  }
  return absl::OkStatus();
}

int64_t HostArena::ResidentBytes() const {
  if (data_ == nullptr) return 0;
  if (!shareable_) return -1;
  int64_t total = 0;
  for (int fd : fds_) {
    struct stat st {};
    if (fd >= 0 && ::fstat(fd, &st) == 0) total += static_cast<int64_t>(st.st_blocks) * 512;
  }
  return total;
}

void HostArena::Reset() {
  for (int& fd : fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  fds_.clear();
  claimed_.clear();
}

}  // namespace kvc::cachesvc
