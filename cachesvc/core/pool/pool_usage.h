// PoolUsage: running totals of one pool's sequences, kept by the sequences themselves as
// they change (Sequence::SyncUsage) so that statistics and metric scrapes read a few
// atomics instead of locking every sequence.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace kvc::cachesvc {

struct PoolUsage {
  // Causes of eviction counted in evicted_token_heads: 0 = an operator (EvictSequence),
  // then CompressionSpec::Eviction values (streaming_llm, snapkv, h2o, expected_attention).
  static constexpr int kEvictionCauses = 5;

  std::atomic<int64_t> sequences{0};
  std::atomic<int64_t> visible_tokens{0};
  std::atomic<int64_t> stored_token_heads{0};
  std::array<std::atomic<int64_t>, kEvictionCauses> evicted_token_heads{};
};

}  // namespace kvc::cachesvc
