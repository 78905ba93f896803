// HostArena: one mapping of `bytes` of host memory, released on destruction. Pages are
// reserved, not committed: an idle 64 GiB pool costs no RSS until blocks are written.
//
// The memory is a memfd (a file in no filesystem) mapped shared, so that a reader on the same
// node can map the same pages read-only (cachesvc/rpc/local_socket.h hands out the fd). The
// fd is sealed against resizing and against any new writable mapping (F_SEAL_FUTURE_WRITE):
// only this process's own mapping can write. Where memfd is unavailable the arena falls back
// to anonymous memory and fd() is -1 (no shared-memory readers then).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvc::cachesvc {

class HostArena {
 public:
  // RESOURCE_EXHAUSTED when the mapping cannot be made. `name` labels the memfd
  // (/proc/PID/fd shows "memfd:NAME").
  static absl::StatusOr<HostArena> Create(size_t bytes, const std::string& name = "kvc-arena");

  HostArena() = default;
  HostArena(HostArena&& other) noexcept;
  HostArena& operator=(HostArena&& other) noexcept;
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;
  ~HostArena();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // The sealed memfd backing the mapping, or -1 (anonymous memory). Owned by the arena.
  int fd() const { return fd_; }

 private:
  HostArena(uint8_t* data, size_t size, int fd) : data_(data), size_(size), fd_(fd) {}
  void Reset();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

}  // namespace kvc::cachesvc
