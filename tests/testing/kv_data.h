// Deterministic KV payloads for tests: every element encodes (layer, kv head, position,
// element) so a wrong, stale or misplaced token is detected, not just a wrong checksum.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvc/kernels/dtype.h"

namespace kvc::testing {

// The f32 value stored for one element. Exactly representable in f16 and bf16 (small
// integers times 1/8 with few significant bits), so conversions round-trip exactly.
inline float KvValue(uint32_t seed, int layer, int head, int64_t position, int element,
                     bool is_value) {
  uint32_t x = seed * 2654435761u ^ static_cast<uint32_t>(layer * 7919 + head * 104729) ^
               static_cast<uint32_t>(position * 31 + element * 131071) ^
               (is_value ? 0x5bd1e995u : 0u);
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return static_cast<float>(static_cast<int>(x % 255) - 127) / 8.0f;
}

// Dense [n, num_kv_heads, head_dim] of `dtype` for positions [start, start + n) of a layer.
inline std::string MakeKv(uint32_t seed, int layer, int64_t start, int n, int num_kv_heads,
                          int head_dim, kernels::DType dtype, bool is_value) {
  std::vector<float> f(static_cast<size_t>(n) * num_kv_heads * head_dim);
  size_t i = 0;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < num_kv_heads; ++h)
      for (int e = 0; e < head_dim; ++e) f[i++] = KvValue(seed, layer, h, start + t, e, is_value);
  std::string out(f.size() * kernels::DTypeSize(dtype), '\0');
  kernels::ConvertElements(f.data(), kernels::DType::kF32, out.data(), dtype, f.size());
  return out;
}

// Dense [n, head_dim] of `dtype` for one head: what Fetch returns per (layer, head).
inline std::string MakeHeadKv(uint32_t seed, int layer, int head, int64_t start, int64_t n,
                              int head_dim, kernels::DType dtype, bool is_value) {
  std::vector<float> f(static_cast<size_t>(n) * head_dim);
  size_t i = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int e = 0; e < head_dim; ++e) f[i++] = KvValue(seed, layer, head, start + t, e, is_value);
  std::string out(f.size() * kernels::DTypeSize(dtype), '\0');
  kernels::ConvertElements(f.data(), kernels::DType::kF32, out.data(), dtype, f.size());
  return out;
}

}  // namespace kvc::testing
