#include "client/tools/loadgen/kv_pattern.h"

namespace kvc::loadgen {

uint16_t PatternBits(uint64_t sequence_key, int layer, int head, int64_t position, int element,
                     bool is_value) {
  // splitmix64 over the packed coordinates: a change in any one of them changes the bits.
  uint64_t x = sequence_key * 0x9e3779b97f4a7c15ull;
  x ^= (static_cast<uint64_t>(position) << 24) ^ (static_cast<uint64_t>(layer) << 12) ^
       (static_cast<uint64_t>(head) << 4) ^ (is_value ? 1ull : 0ull) ^
       (static_cast<uint64_t>(element) << 44);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  const uint16_t magnitude = static_cast<uint16_t>(0x3000 + (x & 0x0fff));
  return static_cast<uint16_t>(magnitude | ((x >> 20) & 1) << 15);
}

void PatternRow(uint64_t sequence_key, int layer, int head, int64_t position, int head_dim,
                bool is_value, char* out) {
  for (int e = 0; e < head_dim; ++e) {
    const uint16_t h = PatternBits(sequence_key, layer, head, position, e, is_value);
    out[2 * e] = static_cast<char>(h & 0xff);
    out[2 * e + 1] = static_cast<char>(h >> 8);
  }
}

std::string PatternTokens(uint64_t sequence_key, int layer, int64_t start, int n, int num_heads,
                          int head_dim, bool is_value) {
  const size_t row = static_cast<size_t>(head_dim) * 2;
  std::string out(static_cast<size_t>(n) * num_heads * row, '\0');
  char* at = out.data();
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < num_heads; ++h, at += row) {
      PatternRow(sequence_key, layer, h, start + t, head_dim, is_value, at);
    }
  }
  return out;
}

}  // namespace kvc::loadgen
