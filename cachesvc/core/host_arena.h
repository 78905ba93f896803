// HostArena: one mapping of `bytes` of host memory, released on destruction. Pages are
// reserved, not committed: an idle 64 GiB pool costs no RSS until blocks are written.
//
// The memory is a memfd (a file in no filesystem) mapped shared, so that a reader on the same
// node can map the same pages read-only (cachesvc/rpc/local_socket.h hands out shared_fd()).
// The memfd is sealed against resizing. Readers never get a writable descriptor:
//  - releasable arenas (the default) hand out a read-only reopen of the memfd, whose mode is
//    0400, so another uid can neither map it writable nor reopen it for writing; pages can be
//    returned to the OS (ReleasePages punches holes). A process of kvcached's own uid could
//    chmod the memfd back and reopen it: the same uid is trusted, as it is with ptrace.
//  - otherwise the memfd itself is sealed against any new writable mapping
//    (F_SEAL_FUTURE_WRITE), which also forbids punching holes: pages stay until the arena
//    goes. That seal holds against every uid, kvcached's own included.
// Where memfd is unavailable the arena falls back to anonymous memory and shared_fd() is -1
// (no shared-memory readers then).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvc::cachesvc {

class HostArena {
 public:
  // RESOURCE_EXHAUSTED when the mapping cannot be made. `name` labels the memfd
  // (/proc/PID/fd shows "memfd:NAME"). `releasable` asks for the first kind above; where
  // this host cannot reopen the memfd read-only (no /proc) the arena is the second kind and
  // releasable() says false.
  static absl::StatusOr<HostArena> Create(size_t bytes, const std::string& name = "kvc-arena",
                                          bool releasable = false);

  HostArena() = default;
  HostArena(HostArena&& other) noexcept;
  HostArena& operator=(HostArena&& other) noexcept;
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;
  ~HostArena();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // The descriptor readers may have: read-only for a releasable arena, the sealed memfd
  // otherwise, -1 for anonymous memory. Owned by the arena.
  int shared_fd() const { return shared_fd_; }
  bool releasable() const { return releasable_; }

  // Returns the pages of [offset, offset + length) to the OS; they read as zeros afterwards
  // and cost memory again when written. Both must be multiples of the page size. Nothing may
  // be using those bytes. Anonymous memory is always releasable; a sealed memfd is not
  // (FAILED_PRECONDITION).
  absl::Status ReleasePages(size_t offset, size_t length);

  // Bytes of the arena that hold pages now (a memfd's allocated size), or -1 for anonymous
  // memory, whose pages only the process's RSS counts.
  int64_t ResidentBytes() const;

 private:
  HostArena(uint8_t* data, size_t size, int fd, int shared_fd, bool releasable)
      : data_(data), size_(size), fd_(fd), shared_fd_(shared_fd), releasable_(releasable) {}
  void Reset();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;         // the memfd, read-write (kept here only)
  int shared_fd_ = -1;  // what readers get (== fd_ when sealed; a read-only reopen otherwise)
  bool releasable_ = false;
};

}  // namespace kvc::cachesvc
