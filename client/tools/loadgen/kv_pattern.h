// The keys and values kvc-loadgen appends: f16 bits that are a pure function of (sequence
// key, layer, kv head, position, element), so any token a Fetch returns can be checked on
// its own, also after an eviction kept an unpredictable subset of positions.
#pragma once

#include <cstdint>
#include <string>

namespace kvc::loadgen {

// The f16 bits of one element: finite, of magnitude 0.125..2 (exponents 12..15), either sign,
// so Attend and SnapKV scoring see ordinary numbers.
uint16_t PatternBits(uint64_t sequence_key, int layer, int head, int64_t position, int element,
                     bool is_value);

// Dense little-endian f16 [n, num_heads, head_dim] for positions [start, start + n) of a layer:
// the layout of an Append.
std::string PatternTokens(uint64_t sequence_key, int layer, int64_t start, int n, int num_heads,
                          int head_dim, bool is_value);

// Little-endian f16 [head_dim] of one (layer, head, position): one row of a dense Fetch lane.
void PatternRow(uint64_t sequence_key, int layer, int head, int64_t position, int head_dim,
                bool is_value, char* out);

}  // namespace kvc::loadgen
