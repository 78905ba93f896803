// HostArena: one anonymous memory mapping of `bytes`, released on destruction. Pages are
// reserved, not committed: an idle 64 GiB pool costs no RSS until blocks are written.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace kvc::cachesvc {

class HostArena {
 public:
  // RESOURCE_EXHAUSTED when the mapping cannot be made.
  static absl::StatusOr<HostArena> Create(size_t bytes);

  HostArena() = default;
  HostArena(HostArena&& other) noexcept;
  HostArena& operator=(HostArena&& other) noexcept;
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;
  ~HostArena();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  HostArena(uint8_t* data, size_t size) : data_(data), size_(size) {}
  void Reset();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvc::cachesvc
