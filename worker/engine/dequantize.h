// Dequantization of ggml tensor blocks to f32 (the engine converts all weights once at load).
// Block formats follow ggml-common.h: Q4_0 {f16 d; u8 qs[16]}, Q4_1 {f16 d, m; u8 qs[16]},
// Q8_0 {f16 d; i8 qs[32]}; 4-bit blocks store element j in the low nibble of qs[j] and
// element j + 16 in the high nibble.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "worker/engine/gguf_file.h"

namespace kvc::worker {

// IEEE half and bfloat16 to float.
float HalfToFloat(uint16_t h);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToHalf(float f);  // round to nearest even; used by tests and fixtures

// Converts `num_elements` values of `type` starting at `src` into `dst`. InvalidArgument for an
// unknown type or a count that is not a whole number of blocks.
absl::Status Dequantize(GgmlType type, const void* src, int64_t num_elements, float* dst);

}  // namespace kvc::worker
