#include "cachesvc/core/page_lease.h"

#include <utility>

namespace kvc::cachesvc {

PageLease::PageLease(PageLease&& other) noexcept
    : pool_(other.pool_),
      format_(other.format_),
      owner_(std::move(other.owner_)),
      blocks_(std::exchange(other.blocks_, {})) {}

PageLease& PageLease::operator=(PageLease&& other) noexcept {
  if (this != &other) {
    if (!blocks_.empty()) pool_->Free(format_, blocks_);
    pool_ = other.pool_;
    format_ = other.format_;
    owner_ = std::move(other.owner_);
    blocks_ = std::exchange(other.blocks_, {});
  }
  return *this;
}

PageLease::~PageLease() {
  if (!blocks_.empty()) pool_->Free(format_, blocks_);
}

absl::Status PageLease::Allocate(int64_t n) {
  return pool_->AllocateOrReclaim(format_, n, owner_, &blocks_);
}

}  // namespace kvc::cachesvc
