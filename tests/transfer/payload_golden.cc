// kvc-payload-golden: the transfer library's payload rule (transfer/payload.h) applied to a
// lease described on stdin, for the Python client's test that its own reader follows the
// same rule (tests/python/test_payload_golden.py). Input, one item per line:
//   arena <format number> <block bytes>
//   segment <format number> <blocks>        (in lease order: lanes, then their segments)
// Output, one item per line:
//   segment <first block index in the payload's blocks of its format>
//   format <number> <offset> <bytes>        (formats with blocks, in number order)
//   piece <format> <first block> <blocks> <offset> <bytes>
//   total <bytes>
#include <array>
#include <cstdint>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "transfer/payload.h"

int main() {
  std::map<int, int64_t> block_bytes;
  kvc::transfer::PayloadNumbering numbering;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream words(line);
    std::string what;
    int format = 0;
    int64_t n = 0;
    if (!(words >> what >> format >> n)) continue;
    if (what == "arena") {
      block_bytes[format] = n;
    } else if (what == "segment") {
      int64_t first = -1;
      for (int64_t i = 0; i < n; ++i) {
        const absl::StatusOr<int64_t> index = numbering.Next(format);
        if (!index.ok()) {
          std::cerr << index.status() << "\n";
          return 2;
        }
        if (i == 0) first = *index;
      }
      std::cout << "segment " << first << "\n";
    }
  }
  std::array<int64_t, kvc::transfer::kMaxFormats> blocks{};
  std::array<int64_t, kvc::transfer::kMaxFormats> bytes{};
  for (int f = 1; f < kvc::transfer::kMaxFormats; ++f) {
    blocks[static_cast<size_t>(f)] = numbering.count(f);
    if (numbering.count(f) > 0) bytes[static_cast<size_t>(f)] = block_bytes[f];
  }
  const absl::StatusOr<kvc::transfer::PayloadLayout> layout =
      kvc::transfer::PayloadLayout::Make(blocks, bytes);
  if (!layout.ok()) {
    std::cerr << layout.status() << "\n";
    return 2;
  }
  for (int f = 1; f < kvc::transfer::kMaxFormats; ++f) {
    if (layout->blocks(f) > 0) {
      std::cout << "format " << f << " " << layout->offset(f) << " " << layout->bytes(f) << "\n";
    }
  }
  for (const kvc::transfer::Piece& p : layout->Pieces()) {
    std::cout << "piece " << p.format << " " << p.first_block << " " << p.blocks << " " << p.offset
              << " " << p.bytes << "\n";
  }
  std::cout << "total " << layout->total_bytes() << "\n";
  return 0;
}
