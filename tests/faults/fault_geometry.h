// The pool the fault tests configure kvcached with, and the deterministic messages both the
// killed client and the test send, so the test can check every stored token.
#pragma once

#include <cstdint>
#include <string>

#include "kvcache/v1/kvcache_service.pb.h"
#include "tests/testing/kv_data.h"

namespace kvc::faults {

constexpr int kLayers = 4, kHeads = 4, kQHeads = 8, kDim = 128;
// Tokens per AppendStream message: 256 x 4 heads x 128 x 2 bytes = 256 KiB of keys and as
// much of values, so a kill often lands while a message is still arriving.
constexpr int kChunk = 256;
constexpr uint32_t kSeed = 11;

inline std::string ConfigText(int64_t capacity_bytes) {
  return "pools { name: 'faults' capacity_bytes: " + std::to_string(capacity_bytes) +
         " geometry { num_layers: 4 num_kv_heads: 4 num_query_heads: 8 head_dim: 128 "
         "block_tokens: 16 dtype: DTYPE_F16 } }\n";
}

inline kvcache::v1::AppendRequest AppendMessage(const std::string& id, int layer, int64_t start,
                                                int n = kChunk) {
  kvcache::v1::AppendRequest r;
  r.set_sequence_id(id);
  r.set_layer(layer);
  r.set_start_position(start);
  r.set_num_tokens(n);
  r.set_keys(testing::MakeKv(kSeed, layer, start, n, kHeads, kDim, kernels::DType::kF16,
                             /*is_value=*/false));
  r.set_values(testing::MakeKv(kSeed, layer, start, n, kHeads, kDim, kernels::DType::kF16,
                               /*is_value=*/true));
  return r;
}

}  // namespace kvc::faults
