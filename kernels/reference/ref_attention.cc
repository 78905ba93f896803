// Reference paged decode attention: dequantize every key and value, plain softmax in fp32.
#include <cmath>
#include <limits>
#include <vector>

#include "kvc/kernels/record_codec.h"
#include "reference/reference_ops.h"

namespace kvc::kernels::reference {

void DecodeAttention(const DecodeAttentionArgs& a) {
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim;
  const float scale = AttentionScale(d);
  std::vector<float> k(d), v(d), q(d), acc(d);
  for (int32_t lane = 0; lane < a.lanes.num_lanes; ++lane) {
    const int32_t n = a.lanes.num_tokens[lane];
    std::vector<float> mean_w(n, 0.0f);
    for (int g = 0; g < a.group_size; ++g) {
      const size_t row = static_cast<size_t>(lane) * a.group_size + g;
      for (int j = 0; j < d; ++j) q[j] = LoadElement(a.queries, a.dtype, row * d + j);
      std::vector<float> logits(n);
      float m = -std::numeric_limits<float>::infinity();
      for (int32_t t = 0; t < n; ++t) {
        int32_t b, s;
        LaneTokenSlot(a.lanes, l.block_tokens, lane, t, &b, &s);
        DequantizeRecord(l.format, d, KeyRecord(a.arena, b, s), k.data());
        float dot = 0.0f;
        for (int j = 0; j < d; ++j) dot += q[j] * k[j];
        logits[t] = dot * scale;
        m = std::max(m, logits[t]);
      }
      float sum = 0.0f;
      for (int32_t t = 0; t < n; ++t) sum += std::exp(logits[t] - m);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int32_t t = 0; t < n; ++t) {
        const float p = std::exp(logits[t] - m) / sum;
        int32_t b, s;
        LaneTokenSlot(a.lanes, l.block_tokens, lane, t, &b, &s);
        DequantizeRecord(l.format, d, ValueRecord(a.arena, b, s), v.data());
        for (int j = 0; j < d; ++j) acc[j] += p * v[j];
        if (a.weights != nullptr) a.weights[row * a.lanes.max_tokens + t] = p;
        mean_w[t] += p / static_cast<float>(a.group_size);
      }
      for (int j = 0; j < d; ++j) StoreElement(a.out, a.dtype, row * d + j, acc[j]);
      if (a.lse != nullptr) {
        a.lse[row] = n > 0 ? m + std::log(sum) : -std::numeric_limits<float>::infinity();
      }
    }
    if (a.scores != nullptr) {
      float* scores = a.scores + static_cast<size_t>(lane) * a.lanes.max_tokens;
      for (int32_t t = 0; t < n; ++t) scores[t] += mean_w[t];
    }
  }
}

}  // namespace kvc::kernels::reference
