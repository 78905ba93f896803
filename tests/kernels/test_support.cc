#include "test_support.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace kvc::kernels::testing {

Session::~Session() {
  for (void* p : buffers_) backend_.Free(p);
}

void* Session::Alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) bytes = 64;
  if (!ctx_.ExpectOk(backend_.Allocate(bytes, &p), "Allocate")) return nullptr;
  buffers_.push_back(p);
  ctx_.ExpectOk(backend_.Memset(p, 0, bytes, StreamHandle{}), "Memset");
  return p;
}

void* Session::UploadBytes(const void* src, size_t bytes) {
  void* p = Alloc(bytes);
  if (p != nullptr && bytes > 0)
    ctx_.ExpectOk(backend_.CopyToDevice(p, src, bytes, StreamHandle{}), "CopyToDevice");
  return p;
}

std::vector<uint8_t> Session::DownloadBytes(const void* src, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  if (bytes == 0 || src == nullptr) return out;
  ctx_.ExpectOk(backend_.CopyToHost(out.data(), src, bytes, StreamHandle{}), "CopyToHost");
  ctx_.ExpectOk(backend_.Synchronize(StreamHandle{}), "Synchronize");
  return out;
}

void LaneSpec::Rows(std::vector<int32_t>* blocks, std::vector<int32_t>* slots) const {
  blocks->clear();
  slots->clear();
  for (int32_t l = 0; l < num_lanes(); ++l) {
    for (int32_t t = 0; t < tokens[l]; ++t) {
      blocks->push_back(ids[offsets[l] + t / layout.block_tokens]);
      slots->push_back(t % layout.block_tokens);
    }
  }
}

LaneSpec MakeLanes(const BlockLayout& layout, const std::vector<int32_t>& tokens_per_lane,
                   int spare_blocks, std::mt19937& rng) {
  LaneSpec s;
  s.layout = layout;
  s.tokens = tokens_per_lane;
  s.offsets.push_back(0);
  int32_t total = 0;
  for (int32_t n : tokens_per_lane) {
    total += std::max(1, (n + layout.block_tokens - 1) / layout.block_tokens);
    s.offsets.push_back(total);
    s.max_tokens = std::max(s.max_tokens, n);
  }
  s.num_blocks = total + spare_blocks;
  std::vector<int32_t> pool(s.num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  s.ids.assign(pool.begin(), pool.begin() + total);
  return s;
}

std::vector<float> RandomRows(int64_t n, int d, DataKind kind, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n) * d);
  for (float& v : x) v = normal(rng);
  if (kind == DataKind::kOutliers) {
    const int channels[4] = {1, d / 3, d / 2 + 1, d - 2};
    for (int64_t r = 0; r < n; ++r) {
      for (int c : channels) x[r * d + c] *= 20.0f;
    }
  }
  return x;
}

std::vector<uint8_t> ToDType(const std::vector<float>& x, DType dtype) {
  std::vector<uint8_t> out(x.size() * DTypeSize(dtype));
  for (size_t i = 0; i < x.size(); ++i) StoreElement(out.data(), dtype, i, x[i]);
  return out;
}

std::vector<float> DecodeDense(const std::vector<uint8_t>& bytes, DType dtype) {
  std::vector<float> out(bytes.size() / DTypeSize(dtype));
  for (size_t i = 0; i < out.size(); ++i) out[i] = LoadElement(bytes.data(), dtype, i);
  return out;
}

std::vector<uint8_t> MakeArenaBytes(const LaneSpec& lanes, DataKind kind, std::mt19937& rng) {
  std::vector<uint8_t> arena(static_cast<size_t>(lanes.num_blocks) * lanes.layout.block_bytes, 0);
  std::vector<int32_t> blocks, slots;
  lanes.Rows(&blocks, &slots);
  const int64_t n = static_cast<int64_t>(blocks.size());
  const int d = lanes.layout.head_dim;
  const std::vector<float> k = RandomRows(n, d, kind, rng), v = RandomRows(n, d, kind, rng);
  std::unique_ptr<KernelBackend> ref;
  if (!CreateBackend(BackendKind::kReference, BackendOptions{}, &ref).ok()) return arena;
  WriteTokensArgs w;
  w.arena = PagedArena{arena.data(), lanes.layout, lanes.num_blocks};
  w.num_rows = static_cast<int32_t>(n);
  w.dtype = DType::kF32;
  w.keys = k.data();
  w.values = v.data();
  w.dst_blocks = blocks.data();
  w.dst_slots = slots.data();
  if (!ref->WriteTokens(w, StreamHandle{}).ok()) return arena;
  return arena;
}

std::vector<int32_t> MakePositions(const LaneSpec& lanes, bool shuffle, std::mt19937& rng) {
  const size_t stride = static_cast<size_t>(lanes.max_tokens);
  std::vector<int32_t> pos(lanes.num_lanes() * stride);
  for (auto& p : pos) p = static_cast<int32_t>(rng());  // padding garbage
  for (int32_t l = 0; l < lanes.num_lanes(); ++l) {
    int32_t* row = &pos[l * stride];
    std::iota(row, row + lanes.tokens[l], 0);
    if (shuffle) std::shuffle(row, row + lanes.tokens[l], rng);
  }
  return pos;
}

std::vector<float> MakeScores(const LaneSpec& lanes, std::mt19937& rng) {
  const size_t stride = static_cast<size_t>(lanes.max_tokens);
  std::vector<float> scores(lanes.num_lanes() * stride);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  for (int32_t l = 0; l < lanes.num_lanes(); ++l) {
    for (int32_t t = 0; t < lanes.max_tokens; ++t)
      // Padding: tiny distinct values, so that a stray write or += shows in their bits.
      scores[l * stride + t] =
          t < lanes.tokens[l] ? uni(rng) : std::ldexp(1.0f, -100) * static_cast<float>(1 + t % 7);
  }
  return scores;
}

int64_t FirstTouchedPadding(const LaneSpec& lanes, const void* before, const void* got,
                            size_t elem_bytes, int rows_per_lane) {
  const auto* a = static_cast<const uint8_t*>(before);
  const auto* b = static_cast<const uint8_t*>(got);
  for (int32_t l = 0; l < lanes.num_lanes(); ++l) {
    for (int r = 0; r < rows_per_lane; ++r) {
      const size_t row = (static_cast<size_t>(l) * rows_per_lane + r) * lanes.max_tokens;
      for (int32_t t = lanes.tokens[l]; t < lanes.max_tokens; ++t) {
        const size_t off = (row + t) * elem_bytes;
        if (std::memcmp(a + off, b + off, elem_bytes) != 0) return static_cast<int64_t>(row + t);
      }
    }
  }
  return -1;
}

std::vector<float> StoredValues(const LaneSpec& lanes, const std::vector<float>& dense) {
  std::vector<float> out;
  for (int32_t l = 0; l < lanes.num_lanes(); ++l) {
    const size_t row = static_cast<size_t>(l) * lanes.max_tokens;
    out.insert(out.end(), dense.begin() + row, dense.begin() + row + lanes.tokens[l]);
  }
  return out;
}

DeviceLanes UploadLanes(Session& s, const LaneSpec& lanes, const std::vector<uint8_t>& arena) {
  DeviceLanes out;
  out.arena = PagedArena{s.UploadBytes(arena.data(), arena.size()), lanes.layout, lanes.num_blocks};
  out.table.num_lanes = lanes.num_lanes();
  out.table.block_offsets = s.Upload(lanes.offsets);
  out.table.block_ids = s.Upload(lanes.ids);
  out.table.num_tokens = s.Upload(lanes.tokens);
  out.table.max_tokens = lanes.max_tokens;
  return out;
}

double Nmse(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    const double e = static_cast<double>(ref[i]) - got[i];
    num += e * e;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  if (ref.size() != got.size()) return 1e30;
  return den > 0 ? num / den : num;
}

double MaxAbs(const std::vector<float>& ref, const std::vector<float>& got) {
  double m = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(ref[i]) - got[i]));
  return m;
}

float QuantStep(StorageFormat format, int d, const uint8_t* rec, int j) {
  const float v = std::fabs(DequantizeElement(format, d, rec, j));
  switch (format) {
    case StorageFormat::kF32:
      return 0.0f;
    case StorageFormat::kF16:
      return std::max(v * 1.0f / 1024.0f, 6e-8f);
    case StorageFormat::kBF16:
      return std::max(v * 1.0f / 128.0f, 1e-38f);
    case StorageFormat::kFp8E4M3: {
      const float s = LoadF32(rec + d);
      const int e = (rec[j] >> 3) & 15;
      return s * std::ldexp(1.0f, std::max(e, 1) - 7 - 3 + 1);  // spacing above this code
    }
    case StorageFormat::kInt8:
      return LoadF32(rec + d);
    case StorageFormat::kInt4G32:
    case StorageFormat::kInt4G64: {
      const int g = j / (format == StorageFormat::kInt4G32 ? 32 : 64);
      return HalfToFloat(LoadU16(rec + d / 2 + 4 * g));
    }
    case StorageFormat::kNvfp4: {
      static const float kGap[8] = {0.5f, 0.5f, 0.5f, 1.0f, 1.0f, 2.0f, 2.0f, 2.0f};
      const uint8_t q = (rec[j / 2] >> (4 * (j & 1))) & 7u;
      return kGap[q] * E4M3ToFloat(rec[d / 2 + j / 16]) * LoadF32(rec + Nvfp4TensorScaleOffset(d));
    }
  }
  return 0.0f;
}

std::string ShapeName(const BlockLayout& l) {
  return Str(StorageFormatName(l.format), "/d", l.head_dim, "/bt", l.block_tokens);
}

std::vector<StorageFormat> AllFormats() {
  std::vector<StorageFormat> f;
  f.reserve(kNumStorageFormats);
  for (int i = 0; i < kNumStorageFormats; ++i) f.push_back(static_cast<StorageFormat>(i));
  return f;
}

}  // namespace kvc::kernels::testing
