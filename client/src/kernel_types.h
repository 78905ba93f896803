// The client's storage formats and dtypes as the kernels name them: the same-node readers
// (host: local_reader.cc, device: device_reader.cc) hand records to the kernels' codec.
#pragma once

#include "kvc/client/types.h"
#include "kvc/kernels/dtype.h"

namespace kvc::client::internal {

inline kernels::StorageFormat KernelFormat(StorageFormat f) {
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
    default:
      return kernels::StorageFormat::kF16;
  }
}

inline kernels::DType KernelDType(DType d) {
  switch (d) {
    case DType::kF32:
      return kernels::DType::kF32;
    case DType::kBF16:
      return kernels::DType::kBF16;
    default:
      return kernels::DType::kF16;
  }
}

}  // namespace kvc::client::internal
