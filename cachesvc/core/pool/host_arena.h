// HostArena: the host memory of one storage format's arena in a host pool: a reservation of
// address space (no memory until written) carved into segments of segment_bytes. A segment is
// backed, while claimed, by a memfd of its own mapped read-write here at its place, so the
// kernels still see one arena (block b at b * block_bytes) while a same-node reader can be
// handed single segments (ShareSegment). That is what isolates tenants by construction: the
// pool claims each segment for one owner (tenant) at a time (host_block_pool.h) and the
// local socket hands a reader only its own tenant's segments.
//
// Every Claim backs the segment with a NEW memfd (zero pages), so bytes never pass from one
// owner to the next through a segment: readers of the previous owner keep a mapping of the
// old memfd, whose pages were returned before Unclaim (they read zeros there).
//
// What readers get cannot write the pool: a read-only reopen of the memfd made after its mode
// dropped to 0400, so another uid can neither map it writable nor reopen it for writing, and
// sealed against resizing (a reader cannot truncate it under kvcached's mapping). A process
// of kvcached's own uid could reopen it (as it could ptrace kvcached): the local socket
// refuses same-uid peers unless configured. Where memfd or /proc is missing the segments are
// anonymous memory and shareable() is false.
//
// Not thread-safe: the pool calls it under its lock, except ReleasePages on blocks no one
// can reach meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cachesvc/core/base/unique_fd.h"

namespace kvc::cachesvc {

class HostArena {
 public:
  // Reserves `bytes` (a multiple of segment_bytes, which is a multiple of the page size) of
  // address space, every segment unclaimed. RESOURCE_EXHAUSTED when the reservation fails.
  // `name` labels the memfds (/proc/PID/fd shows "memfd:NAME").
  static absl::StatusOr<HostArena> Reserve(size_t bytes, size_t segment_bytes, std::string name);

  HostArena() = default;
  HostArena(HostArena&& other) noexcept;
  HostArena& operator=(HostArena&& other) noexcept;
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;
  ~HostArena();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  size_t segment_bytes() const { return segment_bytes_; }
  int64_t num_segments() const { return static_cast<int64_t>(fds_.size()); }
  // Whether segments are memfds a reader can map.
  bool shareable() const { return shareable_; }

  // Backs `segment` with fresh zero pages, read-write here. RESOURCE_EXHAUSTED when the
  // memfd or the mapping cannot be made (out of descriptors or memory map areas).
  absl::Status Claim(int64_t segment);
  // Stops backing `segment` (its address space stays reserved, inaccessible). Return its
  // pages first (ReleasePages): readers that mapped it then read zeros.
  void Unclaim(int64_t segment);
  bool claimed(int64_t segment) const { return claimed_[static_cast<size_t>(segment)]; }
  // A new read-only descriptor of a claimed segment's memfd, owned by the caller.
  // FAILED_PRECONDITION where segments are anonymous memory or `segment` is unclaimed.
  absl::StatusOr<UniqueFd> ShareSegment(int64_t segment) const;

  // Returns the pages of [offset, offset + length) (inside claimed segments, both multiples
  // of the page size) to the OS; they read as zeros afterwards, here and in readers'
  // mappings, and cost memory again when written. Nothing may be using those bytes.
  absl::Status ReleasePages(size_t offset, size_t length);

  // Bytes of claimed segments that hold pages now (the memfds' allocated sizes), or -1 for
  // anonymous memory, whose pages only the process's RSS counts.
  int64_t ResidentBytes() const;

 private:
  void Reset();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t segment_bytes_ = 0;
  std::string name_;
  bool shareable_ = false;
  std::vector<int> fds_;       // per segment: the read-only reopen of its memfd, or -1
  std::vector<bool> claimed_;  // per segment
};

}  // namespace kvc::cachesvc
