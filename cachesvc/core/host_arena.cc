#include "cachesvc/core/host_arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvc::cachesvc {

absl::StatusOr<HostArena> HostArena::Create(size_t bytes) {
  if (bytes == 0) return HostArena();
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot map ", bytes,
        " bytes of host memory for the pool: ", std::generic_category().message(errno)));
  }
  return HostArena(static_cast<uint8_t*>(p), bytes);
}

HostArena::HostArena(HostArena&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

HostArena& HostArena::operator=(HostArena&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

HostArena::~HostArena() { Reset(); }

void HostArena::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace kvc::cachesvc
