#include "transfer/payload.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kvc::transfer {

size_t PieceBlocks(size_t block_bytes) {
  return std::max<size_t>(1, kPieceBytes / std::max<size_t>(1, block_bytes));
}

absl::StatusOr<int64_t> PayloadNumbering::Next(int format) {
  if (format < 1 || format >= kMaxFormats) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage format ", format, " is not one a payload carries"));
  }
  return count_[static_cast<size_t>(format)]++;
}

absl::StatusOr<PayloadLayout> PayloadLayout::Make(
    const std::array<int64_t, kMaxFormats>& blocks,
    const std::array<int64_t, kMaxFormats>& block_bytes) {
  PayloadLayout layout;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (size_t f = 0; f < static_cast<size_t>(kMaxFormats); ++f) {
    layout.offset_[f] = layout.total_;
    if (blocks[f] == 0) continue;
    if (f == 0 || blocks[f] < 0 || block_bytes[f] <= 0 || blocks[f] > kMax / block_bytes[f] ||
        layout.total_ > kMax - blocks[f] * block_bytes[f]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a payload of ", blocks[f], " blocks of format ", f, " of ", block_bytes[f], " bytes"));
    }
    layout.blocks_[f] = blocks[f];
    layout.block_bytes_[f] = block_bytes[f];
    layout.bytes_[f] = blocks[f] * block_bytes[f];
    layout.total_ += layout.bytes_[f];
  }
  return layout;
}

int64_t PayloadLayout::total_blocks() const {
  int64_t n = 0;
  for (int64_t b : blocks_) n += b;
  return n;
}

std::vector<Piece> PayloadLayout::Pieces() const {
  std::vector<Piece> pieces;
  for (int f = 1; f < kMaxFormats; ++f) {
    const int64_t n = blocks(f);
    const auto per_piece = static_cast<int64_t>(PieceBlocks(static_cast<size_t>(block_bytes(f))));
    for (int64_t at = 0; at < n; at += per_piece) {
      const int64_t count = std::min(per_piece, n - at);
      pieces.push_back(
          Piece{f, at, count, offset(f) + at * block_bytes(f), count * block_bytes(f)});
    }
  }
  return pieces;
}

int64_t PayloadLayout::largest_piece() const {
  int64_t largest = 0;
  for (int f = 1; f < kMaxFormats; ++f) {
    if (blocks(f) == 0) continue;
    const auto per_piece = static_cast<int64_t>(PieceBlocks(static_cast<size_t>(block_bytes(f))));
    largest = std::max(largest, std::min(per_piece, blocks(f)) * block_bytes(f));
  }
  return largest;
}

}  // namespace kvc::transfer
