// Checks a prefill-mode Fetch (kvc-loadgen's default mode) against the keys and values it
// appended: every (layer, kv head) lane exactly once, positions 0..tokens-1 in order, and
// every key and every value byte of every row. The prefill mode stores in the pool's raw
// format, so the result must equal the input byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvc/client/types.h"

namespace kvc::loadgen {

// What was appended: per layer, [tokens, num_heads, head_bytes] keys and values.
struct AppendedKv {
  const std::vector<std::string>* keys = nullptr;
  const std::vector<std::string>* values = nullptr;
  int num_heads = 0;
  size_t head_bytes = 0;  // head_dim x dtype bytes
  int64_t tokens = 0;
};

// OK, or DATA_LOSS naming the first lane, token and half (keys/values) that differs, or the
// lane that is missing, repeated or of the wrong length.
absl::Status CheckDense(const client::FetchResult& got, const AppendedKv& appended);

}  // namespace kvc::loadgen
