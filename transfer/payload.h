// The payload of one SendLease (kvcache.v1 OpenTransferResponse; docs/ARCHITECTURE.md
// "Transfers"), the one definition kvcached's sender and every reader (the C++
// TransferReader and NcclLink; the Python client, checked against golden payloads this
// library makes) follow:
//  - a lease's blocks as they lie in the pool, storage format by storage format in number
//    order, each format's blocks in lease order (lanes in order; a lane's segments oldest
//    tier first; a segment's blocks in order), each block_bytes of its format long; slots
//    past a lane's tokens are zeros;
//  - so block i of format f in that order lies at offset(f) + i * block_bytes(f), and a
//    reader renumbers each segment's blocks to i (PayloadNumbering) to read the payload as
//    it would read the pool's arenas;
//  - sent in pieces: per format, runs of PieceBlocks(block_bytes) blocks, the last run of a
//    format shorter (an NCCL reader posts one receive per piece; a TCP reader may ignore
//    them).
// Storage formats are numbers here (kvcache.v1.StorageFormat), so this library depends on
// neither the kernels nor protobuf.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace kvc::transfer {

// Storage format numbers are 1 .. kMaxFormats - 1 (0 is UNSPECIFIED).
inline constexpr int kMaxFormats = 16;
// The size one piece aims at.
inline constexpr size_t kPieceBytes = size_t{4} << 20;
// Blocks per piece of a format whose blocks are `block_bytes` long: max(1, 4 MiB / that).
size_t PieceBlocks(size_t block_bytes);

// Gives each of a lease's blocks, visited in lease order, its index within its format's
// part of the payload.
class PayloadNumbering {
 public:
  // INVALID_ARGUMENT for a format number outside 1 .. kMaxFormats - 1.
  absl::StatusOr<int64_t> Next(int format);
  int64_t count(int format) const { return count_[static_cast<size_t>(format)]; }

 private:
  std::array<int64_t, kMaxFormats> count_{};
};

struct Piece {
  int format = 0;
  int64_t first_block = 0;  // index within the format's blocks
  int64_t blocks = 0;
  int64_t offset = 0;  // bytes into the payload
  int64_t bytes = 0;
};

class PayloadLayout {
 public:
  // `blocks[f]` blocks of `block_bytes[f]` bytes for each format number f. INVALID_ARGUMENT
  // for blocks without a positive block size, or sizes that overflow.
  static absl::StatusOr<PayloadLayout> Make(const std::array<int64_t, kMaxFormats>& blocks,
                                            const std::array<int64_t, kMaxFormats>& block_bytes);
  int64_t offset(int format) const { return offset_[static_cast<size_t>(format)]; }
  int64_t bytes(int format) const { return bytes_[static_cast<size_t>(format)]; }
  int64_t blocks(int format) const { return blocks_[static_cast<size_t>(format)]; }
  int64_t block_bytes(int format) const { return block_bytes_[static_cast<size_t>(format)]; }
  int64_t total_bytes() const { return total_; }
  int64_t total_blocks() const;
  // The pieces in the order they are sent.
  std::vector<Piece> Pieces() const;
  // The largest piece, in bytes (0 for an empty payload): what a sender's buffer needs.
  int64_t largest_piece() const;

 private:
  std::array<int64_t, kMaxFormats> blocks_{};
  std::array<int64_t, kMaxFormats> block_bytes_{};
  std::array<int64_t, kMaxFormats> offset_{};
  std::array<int64_t, kMaxFormats> bytes_{};
  int64_t total_ = 0;
};

}  // namespace kvc::transfer
