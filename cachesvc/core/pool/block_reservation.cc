#include "cachesvc/core/pool/block_reservation.h"

#include <utility>

namespace kvc::cachesvc {

BlockReservation::BlockReservation(BlockReservation&& other) noexcept
    : pool_(other.pool_),
      format_(other.format_),
      owner_(std::move(other.owner_)),
      blocks_(std::exchange(other.blocks_, {})) {}

BlockReservation& BlockReservation::operator=(BlockReservation&& other) noexcept {
  if (this != &other) {
    if (!blocks_.empty()) pool_->Free(format_, blocks_);
    pool_ = other.pool_;
    format_ = other.format_;
    owner_ = std::move(other.owner_);
    blocks_ = std::exchange(other.blocks_, {});
  }
  return *this;
}

BlockReservation::~BlockReservation() {
  if (!blocks_.empty()) pool_->Free(format_, blocks_);
}

absl::Status BlockReservation::Allocate(int64_t n) {
  return pool_->AllocateOrReclaim(format_, n, owner_, &blocks_);
}

}  // namespace kvc::cachesvc
