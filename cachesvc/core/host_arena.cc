#include "cachesvc/core/host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1; older libc headers lack the name
#endif

namespace kvc::cachesvc {
namespace {

absl::Status MapError(size_t bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat("cannot map ", bytes,
                   " bytes of host memory for the pool: ", std::generic_category().message(errno)));
}

// A sealed memfd of `bytes` mapped read-write here, or -1 when this kernel or sandbox has no
// memfd (the caller falls back to anonymous memory).
int SharedMemoryFd(size_t bytes, const std::string& name, void** mapped) {
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    ::close(fd);
    return -1;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return -1;
  }
  // After our own writable mapping: nobody else can map it writable, grow or shrink it.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) !=
      0) {
    ::munmap(p, bytes);
    ::close(fd);
    return -1;
  }
  *mapped = p;
  return fd;
}

}  // namespace

absl::StatusOr<HostArena> HostArena::Create(size_t bytes, const std::string& name) {
  if (bytes == 0) return HostArena();
  void* shared = nullptr;
  const int fd = SharedMemoryFd(bytes, name, &shared);
  if (fd >= 0) return HostArena(static_cast<uint8_t*>(shared), bytes, fd);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return MapError(bytes);
  return HostArena(static_cast<uint8_t*>(p), bytes, -1);
}

HostArena::HostArena(HostArena&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

HostArena& HostArena::operator=(HostArena&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

HostArena::~HostArena() { Reset(); }

void HostArena::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
}

}  // namespace kvc::cachesvc
