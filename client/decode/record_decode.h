// DecodeRecords: stored K/V records as the dense rows an engine reads, on the client's side of
// the same-node path (client/src/local_reader.cc). The values are bit for bit those of the
// kernels' specification, kernels::DequantizeRecord followed by kernels::StoreElement (so the
// same as the service's decode over gRPC); only the way there is faster. 4-bit formats (INT4,
// NVFP4) decode through a 16-entry table per scale group, already in the output dtype, looked
// up with SSSE3 byte shuffles where the CPU has them; others dequantize a record to floats
// and convert with a loop specialized for the dtype.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvc/kernels/dtype.h"
#include "kvc/kernels/record_codec.h"

namespace kvc::client::internal {

// Writes `count` records of `format` (head_dim d, one every record_bytes bytes from
// `records`) as `count` dense rows of d elements of `dtype` at `out`, row after row. d must
// be one the format allows (the lease's head_dim is).
void DecodeRecords(kernels::StorageFormat format, kernels::DType dtype, int d, size_t record_bytes,
                   const uint8_t* records, size_t count, void* out);

// The same through the specification, element by element (the tests' reference, and the
// fallback for a format the fast path does not know).
void DecodeRecordsReference(kernels::StorageFormat format, kernels::DType dtype, int d,
                            size_t record_bytes, const uint8_t* records, size_t count, void* out);

}  // namespace kvc::client::internal
