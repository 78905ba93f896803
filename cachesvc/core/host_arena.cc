#include "cachesvc/core/host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1; older libc headers lack the name
#endif

namespace kvc::cachesvc {
namespace {

std::string Errno() { return std::generic_category().message(errno); }

absl::Status MapError(size_t bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat("cannot map ", bytes, " bytes of host memory for the pool: ", Errno()));
}

// A read-only descriptor of `fd` that nobody but kvcached's uid (or root) can turn into a
// writable one: the memfd's mode drops to 0400 first, and reopening checks the mode. -1 when
// /proc is not there.
int ReadOnlyReopen(int fd) {
  if (::fchmod(fd, 0400) != 0) return -1;
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  return ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
}

struct SharedMemory {
  void* mapped = nullptr;
  int fd = -1;
  int shared_fd = -1;
  bool releasable = false;
};

// A memfd of `bytes` mapped read-write here, sealed as host_arena.h describes; false when
// this kernel or sandbox has no memfd (the caller falls back to anonymous memory).
bool MakeSharedMemory(size_t bytes, const std::string& name, bool releasable, SharedMemory* out) {
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return false;
  const auto fail = [&](void* p, int read_only) {
    if (p != nullptr) ::munmap(p, bytes);
    if (read_only >= 0) ::close(read_only);
    ::close(fd);
    return false;
  };
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail(nullptr, -1);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) return fail(nullptr, -1);
  const int read_only = releasable ? ReadOnlyReopen(fd) : -1;
  // After our own writable mapping: nobody grows or shrinks it, and without a read-only
  // reopen nobody else maps it writable.
  int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (read_only < 0) seals |= F_SEAL_FUTURE_WRITE;
  if (::fcntl(fd, F_ADD_SEALS, seals) != 0) return fail(p, read_only);
  *out = SharedMemory{p, fd, read_only >= 0 ? read_only : fd, read_only >= 0};
  return true;
}

}  // namespace

absl::StatusOr<HostArena> HostArena::Create(size_t bytes, const std::string& name,
                                            bool releasable) {
  if (bytes == 0) return HostArena();
  SharedMemory shared;
  if (MakeSharedMemory(bytes, name, releasable, &shared)) {
    return HostArena(static_cast<uint8_t*>(shared.mapped), bytes, shared.fd, shared.shared_fd,
                     shared.releasable);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return MapError(bytes);
  return HostArena(static_cast<uint8_t*>(p), bytes, -1, -1, /*releasable=*/true);
}

HostArena::HostArena(HostArena&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)),
      shared_fd_(std::exchange(other.shared_fd_, -1)),
      releasable_(std::exchange(other.releasable_, false)) {}

HostArena& HostArena::operator=(HostArena&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    shared_fd_ = std::exchange(other.shared_fd_, -1);
    releasable_ = std::exchange(other.releasable_, false);
  }
  return *this;
}

HostArena::~HostArena() { Reset(); }

absl::Status HostArena::ReleasePages(size_t offset, size_t length) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (offset % page != 0 || length % page != 0 || offset > size_ || length > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("cannot release [", offset, ", +", length,
                                                   ") of an arena of ", size_, " bytes"));
  }
  if (!releasable_) {
    return absl::FailedPreconditionError("this arena is sealed: its pages stay until it goes");
  }
  if (length == 0) return absl::OkStatus();
  // A memfd's pages belong to the file: punching the hole frees them (and zeroes readers'
  // views); MADV_DONTNEED would only unmap them here. Private anonymous memory is the reverse.
  const int rc = fd_ >= 0 ? ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                        static_cast<off_t>(offset), static_cast<off_t>(length))
                          : ::madvise(data_ + offset, length, MADV_DONTNEED);
  if (rc != 0) return absl::InternalError(absl::StrCat("releasing pool pages: ", Errno()));
  return absl::OkStatus();
}

int64_t HostArena::ResidentBytes() const {
  if (fd_ < 0) return data_ == nullptr ? 0 : -1;
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return -1;
  return static_cast<int64_t>(st.st_blocks) * 512;
}

void HostArena::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (shared_fd_ >= 0 && shared_fd_ != fd_) ::close(shared_fd_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
  shared_fd_ = -1;
  releasable_ = false;
}

}  // namespace kvc::cachesvc
