// Reader for GGUF model files (versions 2 and 3): memory-maps the file, validates the header,
// metadata and tensor table against the file size, and exposes tensors as views into the map.
// Depends on Abseil only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvc::worker {

// GGUF metadata value types (numbering fixed by the GGUF spec).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// ggml tensor types this engine knows about (numbering fixed by ggml).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 8,
  kBF16 = 30,
};

// Name for messages ("Q4_1"); "type N" for unknown values.
std::string GgmlTypeName(uint32_t type);

// One metadata value. Scalars live in the widest member of their kind; arrays keep the element
// type in `array_type` and their elements in `ints`, `floats` or `strings`.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint32;
  GgufValueType array_type = GgufValueType::kUint32;
  int64_t int_value = 0;  // all integer types and bool
  double float_value = 0;
  std::string string_value;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
};

// A tensor in the file. dims[0] is the innermost (contiguous) dimension, as in ggml: a matrix
// with dims {in, out} is `out` rows of `in` elements.
struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> dims;
  const uint8_t* data = nullptr;  // into the mapping; valid while the GgufFile lives
  uint64_t num_bytes = 0;

  int64_t num_elements() const;
};

// An open, validated GGUF file. Move-only; tensor data pointers die with it.
class GgufFile {
 public:
  // Opens and validates `path`. NotFound when it cannot be opened; InvalidArgument (with the
  // offending field named) when it is not a well-formed GGUF file or uses an unknown tensor
  // type.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

  // Typed metadata lookups: NotFound when absent, InvalidArgument on a type mismatch.
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  absl::StatusOr<double> GetFloat(absl::string_view key) const;
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  absl::StatusOr<const GgufValue*> GetArray(absl::string_view key) const;

  // Tensor by name, or nullptr.
  const GgufTensor* FindTensor(absl::string_view name) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  void* map_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
};

// Bytes needed to store `num_elements` of `type`; InvalidArgument when the count is not a whole
// number of blocks or the type is unknown.
absl::StatusOr<uint64_t> GgmlRowBytes(GgmlType type, int64_t num_elements);

}  // namespace kvc::worker
