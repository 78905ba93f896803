// StagingSpace: the client's half of a staging region (cachesvc/transport/staging_regions.h): the
// region the server made for this client, mapped writable here, and which of its bytes an
// Append in flight is using. Append copies a chunk's keys and values into a slot, sends an
// AppendRequest whose `staged` field points at them, and frees the slot when the call returns
// (the server has then read them). Thread-safe: concurrent Appends take disjoint slots.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace kvc::client::internal {

class StagingSpace {
 public:
  // Takes the writable mapping [base, base + bytes) of region `id`; unmaps it on destruction.
  StagingSpace(std::string id, uint8_t* base, int64_t bytes)
      : id_(std::move(id)), base_(base), bytes_(bytes) {}
  StagingSpace(const StagingSpace&) = delete;
  StagingSpace& operator=(const StagingSpace&) = delete;
  ~StagingSpace();

  // Bytes [offset, offset + bytes) of the region, free again when the slot is destroyed.
  class Slot {
   public:
    Slot(Slot&& other) noexcept
        : space_(std::exchange(other.space_, nullptr)), offset_(other.offset_) {}
    Slot& operator=(Slot&& other) noexcept {
      if (this != &other) {
        if (space_ != nullptr) space_->Release(offset_);
        space_ = std::exchange(other.space_, nullptr);
        offset_ = other.offset_;
      }
      return *this;
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() {
      if (space_ != nullptr) space_->Release(offset_);
    }
    // Never frees these bytes (the server might still be reading them): the region keeps
    // that much less room.
    void Abandon() { space_ = nullptr; }
    int64_t offset() const { return offset_; }
    uint8_t* data() const { return space_->base_ + offset_; }  // before Abandon()

   private:
    friend class StagingSpace;
    Slot(StagingSpace* space, int64_t offset) : space_(space), offset_(offset) {}
    StagingSpace* space_;
    int64_t offset_;
  };

  // A slot of `bytes` (64-byte aligned), or nothing when no free run is that long (the caller
  // sends its bytes over gRPC instead of waiting).
  std::optional<Slot> Acquire(int64_t bytes);

  const std::string& id() const { return id_; }
  int64_t bytes() const { return bytes_; }

 private:
  void Release(int64_t offset);

  const std::string id_;
  uint8_t* const base_;
  const int64_t bytes_;
  kvc::Mutex mu_;
  std::map<int64_t, int64_t> used_ ABSL_GUARDED_BY(mu_);  // offset -> bytes, disjoint
};

}  // namespace kvc::client::internal
