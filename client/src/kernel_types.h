// The client's storage formats and dtypes as the kernels name them: the same-node readers
// (host: local_reader.cc, device: device_reader.cc) hand records to the kernels' codec.
// nullopt for kPoolDefault and for what a newer server may send that this client does not
// know: never a guess (a record decoded as the wrong format is wrong KV).
#pragma once

#include <optional>

#include "kvc/client/types.h"
#include "kvc/kernels/dtype.h"

namespace kvc::client::internal {

// The client's enumerators are the kernels' (checked in convert.cc), with other numbers.
#define KVC_KERNEL_CASE(Type, e) \
  case Type::e:                  \
    return kernels::Type::e;
#define KVC_KERNEL_FORMAT(e, k, w, p, n) KVC_KERNEL_CASE(StorageFormat, e)
#define KVC_KERNEL_DTYPE(e, k, w, p, n) KVC_KERNEL_CASE(DType, e)

inline std::optional<kernels::StorageFormat> KernelFormat(StorageFormat f) {
  switch (f) {
    KVC_STORAGE_FORMATS(KVC_KERNEL_FORMAT)
    default:
      return std::nullopt;
  }
}

inline std::optional<kernels::DType> KernelDType(DType d) {
  switch (d) {
    KVC_DTYPES(KVC_KERNEL_DTYPE)
    default:
      return std::nullopt;
  }
}

#undef KVC_KERNEL_DTYPE
#undef KVC_KERNEL_FORMAT
#undef KVC_KERNEL_CASE

}  // namespace kvc::client::internal
