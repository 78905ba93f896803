// The client's storage formats and dtypes as the kernels name them: the same-node readers
// (host: local_reader.cc, device: device_reader.cc) hand records to the kernels' codec.
// nullopt for kPoolDefault and for what a newer server may send that this client does not
// know: never a guess (a record decoded as the wrong format is wrong KV).
#pragma once

#include <optional>

#include "kvc/client/types.h"
#include "kvc/kernels/dtype.h"

namespace kvc::client::internal {

inline std::optional<kernels::StorageFormat> KernelFormat(StorageFormat f) {
  switch (f) {
    case StorageFormat::kF32:
      return kernels::StorageFormat::kF32;
    case StorageFormat::kBF16:
      return kernels::StorageFormat::kBF16;
    case StorageFormat::kFp8E4M3:
      return kernels::StorageFormat::kFp8E4M3;
    case StorageFormat::kInt8:
      return kernels::StorageFormat::kInt8;
    case StorageFormat::kInt4G32:
      return kernels::StorageFormat::kInt4G32;
    case StorageFormat::kInt4G64:
      return kernels::StorageFormat::kInt4G64;
    case StorageFormat::kNvfp4:
      return kernels::StorageFormat::kNvfp4;
    case StorageFormat::kF16:
      return kernels::StorageFormat::kF16;
    default:
      return std::nullopt;
  }
}

inline std::optional<kernels::DType> KernelDType(DType d) {
  switch (d) {
    case DType::kF32:
      return kernels::DType::kF32;
    case DType::kBF16:
      return kernels::DType::kBF16;
    case DType::kF16:
      return kernels::DType::kF16;
    default:
      return std::nullopt;
  }
}

}  // namespace kvc::client::internal
