#include "worker/engine/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvc::worker {
namespace {

constexpr uint64_t kMaxStringBytes = 1u << 26;    // a token list entry, a chat template
constexpr uint64_t kMaxArrayElements = 1u << 24;  // vocabularies are ~1e5
constexpr uint32_t kMaxDims = 4;

// Bounds-checked little-endian cursor over the mapping.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t offset() const { return offset_; }

  template <typename T>
  absl::Status Read(T& out, absl::string_view what) {
    if (size_ - offset_ < sizeof(T)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF truncated while reading ", what, " at byte ", offset_));
    }
    std::memcpy(&out, data_ + offset_, sizeof(T));
    offset_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string& out, absl::string_view what) {
    uint64_t len = 0;
    if (auto s = Read(len, what); !s.ok()) return s;
    if (len > kMaxStringBytes || size_ - offset_ < len) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF string too long or truncated (", len, " bytes) in ", what));
    }
    out.assign(reinterpret_cast<const char*>(data_ + offset_), len);
    offset_ += len;
    return absl::OkStatus();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

// Reads one T and widens it into `out`.
template <typename T, typename Out>
absl::Status ReadAs(Cursor& cur, Out& out, const std::string& key) {
  T x{};
  if (auto s = cur.Read(x, key); !s.ok()) return s;
  out = static_cast<Out>(x);
  return absl::OkStatus();
}

absl::Status ReadScalar(Cursor& cur, GgufValueType type, GgufValue& v, const std::string& key) {
  switch (type) {
    case GgufValueType::kUint8:
      return ReadAs<uint8_t>(cur, v.int_value, key);
    case GgufValueType::kInt8:
      return ReadAs<int8_t>(cur, v.int_value, key);
    case GgufValueType::kUint16:
      return ReadAs<uint16_t>(cur, v.int_value, key);
    case GgufValueType::kInt16:
      return ReadAs<int16_t>(cur, v.int_value, key);
    case GgufValueType::kUint32:
      return ReadAs<uint32_t>(cur, v.int_value, key);
    case GgufValueType::kInt32:
      return ReadAs<int32_t>(cur, v.int_value, key);
    case GgufValueType::kUint64:
      return ReadAs<uint64_t>(cur, v.int_value, key);
    case GgufValueType::kInt64:
      return ReadAs<int64_t>(cur, v.int_value, key);
    case GgufValueType::kFloat32:
      return ReadAs<float>(cur, v.float_value, key);
    case GgufValueType::kFloat64:
      return ReadAs<double>(cur, v.float_value, key);
    case GgufValueType::kBool: {
      if (auto s = ReadAs<uint8_t>(cur, v.int_value, key); !s.ok()) return s;
      if (v.int_value > 1)
        return absl::InvalidArgumentError(absl::StrCat("GGUF bool not 0/1 in ", key));
      return absl::OkStatus();
    }
    case GgufValueType::kString:
      return cur.ReadString(v.string_value, key);
    case GgufValueType::kArray:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF metadata ", key, " has unknown value type ", static_cast<uint32_t>(type)));
}

bool IsIntType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kBool:
      return true;
    default:
      return false;
  }
}

absl::Status ReadValue(Cursor& cur, GgufValue& v, const std::string& key) {
  uint32_t raw_type = 0;
  if (auto s = cur.Read(raw_type, key); !s.ok()) return s;
  v.type = static_cast<GgufValueType>(raw_type);
  if (v.type != GgufValueType::kArray) return ReadScalar(cur, v.type, v, key);

  uint32_t raw_elem = 0;
  uint64_t count = 0;
  if (auto s = cur.Read(raw_elem, key); !s.ok()) return s;
  if (auto s = cur.Read(count, key); !s.ok()) return s;
  if (count > kMaxArrayElements) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF array ", key, " too long: ", count));
  }
  v.array_type = static_cast<GgufValueType>(raw_elem);
  if (v.array_type == GgufValueType::kArray) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF nested arrays unsupported: ", key));
  }
  GgufValue elem;
  for (uint64_t i = 0; i < count; ++i) {
    if (auto s = ReadScalar(cur, v.array_type, elem, key); !s.ok()) return s;
    if (v.array_type == GgufValueType::kString) {
      v.strings.push_back(std::move(elem.string_value));
    } else if (IsIntType(v.array_type)) {
      v.ints.push_back(elem.int_value);
    } else {
      v.floats.push_back(elem.float_value);
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string GgmlTypeName(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kQ4_0:
      return "Q4_0";
    case GgmlType::kQ4_1:
      return "Q4_1";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kBF16:
      return "BF16";
  }
  return absl::StrCat("type ", type);
}

absl::StatusOr<uint64_t> GgmlRowBytes(GgmlType type, int64_t n) {
  int64_t block = 1;
  int64_t block_bytes = 0;
  switch (type) {
    case GgmlType::kF32:
      block_bytes = 4;
      break;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      block_bytes = 2;
      break;
    case GgmlType::kQ4_0:
      block = 32;
      block_bytes = 18;
      break;
    case GgmlType::kQ4_1:
      block = 32;
      block_bytes = 20;
      break;
    case GgmlType::kQ8_0:
      block = 32;
      block_bytes = 34;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported tensor type ", GgmlTypeName(static_cast<uint32_t>(type))));
  }
  if (n < 0 || n % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(n, " elements is not a whole number of ",
                                                   GgmlTypeName(static_cast<uint32_t>(type)),
                                                   " blocks of ", block));
  }
  return static_cast<uint64_t>(n / block * block_bytes);
}

int64_t GgufTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::generic_category().message(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 24) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": too small to be a GGUF file"));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->size_ = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("mmap ", path, ": ", std::generic_category().message(errno)));
  }
  file->map_ = map;
  if (auto s = file->Parse(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return file;
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

absl::Status GgufFile::Parse() {
  const auto* base = static_cast<const uint8_t*>(map_);
  Cursor cur(base, size_);
  uint32_t magic = 0;
  if (auto s = cur.Read(magic, "magic"); !s.ok()) return s;
  if (std::memcmp(&magic, "GGUF", 4) != 0) {
    return absl::InvalidArgumentError("not a GGUF file (magic is not 'GGUF')");
  }
  if (auto s = cur.Read(version_, "version"); !s.ok()) return s;
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported GGUF version ", version_, " (need 2 or 3)"));
  }
  uint64_t tensor_count = 0, kv_count = 0;
  if (auto s = cur.Read(tensor_count, "tensor_count"); !s.ok()) return s;
  if (auto s = cur.Read(kv_count, "kv_count"); !s.ok()) return s;
  if (tensor_count > 1u << 20 || kv_count > 1u << 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("implausible counts: ", tensor_count, " tensors, ", kv_count, " keys"));
  }
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key;
    if (auto s = cur.ReadString(key, "metadata key"); !s.ok()) return s;
    GgufValue value;
    if (auto s = ReadValue(cur, value, key); !s.ok()) return s;
    if (!metadata_.emplace(key, std::move(value)).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate metadata key ", key));
    }
  }

  std::vector<uint64_t> offsets;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor t;
    if (auto s = cur.ReadString(t.name, "tensor name"); !s.ok()) return s;
    uint32_t n_dims = 0;
    if (auto s = cur.Read(n_dims, t.name); !s.ok()) return s;
    if (n_dims == 0 || n_dims > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " has ", n_dims, " dims"));
    }
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      if (auto s = cur.Read(dim, t.name); !s.ok()) return s;
      if (dim == 0 || dim > (1ull << 32)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " has dim ", dim));
      }
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    uint32_t type = 0;
    uint64_t offset = 0;
    if (auto s = cur.Read(type, t.name); !s.ok()) return s;
    if (auto s = cur.Read(offset, t.name); !s.ok()) return s;
    t.type = static_cast<GgmlType>(type);
    auto row_bytes = GgmlRowBytes(t.type, t.dims[0]);
    if (!row_bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": ", row_bytes.status().message()));
    }
    t.num_bytes = *row_bytes * static_cast<uint64_t>(t.num_elements() / t.dims[0]);
    offsets.push_back(offset);
    tensors_.push_back(std::move(t));
  }

  uint64_t alignment = 32;
  if (auto it = metadata_.find("general.alignment"); it != metadata_.end()) {
    alignment = static_cast<uint64_t>(it->second.int_value);
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("general.alignment ", alignment));
    }
  }
  const uint64_t data_start = (cur.offset() + alignment - 1) / alignment * alignment;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensor& t = tensors_[i];
    const uint64_t begin = data_start + offsets[i];
    if (offsets[i] % alignment != 0 || begin > size_ || size_ - begin < t.num_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " (offset ", offsets[i],
                                                     ", ", t.num_bytes,
                                                     " bytes) lies outside the file or is "
                                                     "misaligned; truncated download?"));
    }
    t.data = base + begin;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> GgufFile::GetInt(absl::string_view key) const {
  auto it = metadata_.find(std::string(key));
  if (it == metadata_.end()) return absl::NotFoundError(absl::StrCat("missing key ", key));
  if (!IsIntType(it->second.type)) {
    return absl::InvalidArgumentError(absl::StrCat("key ", key, " is not an integer"));
  }
  return it->second.int_value;
}

absl::StatusOr<double> GgufFile::GetFloat(absl::string_view key) const {
  auto it = metadata_.find(std::string(key));
  if (it == metadata_.end()) return absl::NotFoundError(absl::StrCat("missing key ", key));
  const GgufValueType t = it->second.type;
  if (t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64) return it->second.float_value;
  if (IsIntType(t)) return static_cast<double>(it->second.int_value);
  return absl::InvalidArgumentError(absl::StrCat("key ", key, " is not a number"));
}

absl::StatusOr<std::string> GgufFile::GetString(absl::string_view key) const {
  auto it = metadata_.find(std::string(key));
  if (it == metadata_.end()) return absl::NotFoundError(absl::StrCat("missing key ", key));
  if (it->second.type != GgufValueType::kString) {
    return absl::InvalidArgumentError(absl::StrCat("key ", key, " is not a string"));
  }
  return it->second.string_value;
}

absl::StatusOr<const GgufValue*> GgufFile::GetArray(absl::string_view key) const {
  auto it = metadata_.find(std::string(key));
  if (it == metadata_.end()) return absl::NotFoundError(absl::StrCat("missing key ", key));
  if (it->second.type != GgufValueType::kArray) {
    return absl::InvalidArgumentError(absl::StrCat("key ", key, " is not an array"));
  }
  return &it->second;
}

const GgufTensor* GgufFile::FindTensor(absl::string_view name) const {
  for (const GgufTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace kvc::worker
