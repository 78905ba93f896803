// Helpers for kernel checks: buffers in a backend's memory, random paged scenarios and
// error measures (NMSE as in ggml's test-backend-ops, per-element quantization steps).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "check_framework.h"
#include "kvc/kernels/backend.h"
#include "kvc/kernels/record_codec.h"

namespace kvc::kernels::testing {

// Buffers in one backend's memory, freed with the session. Errors are reported to ctx.
class Session {
 public:
  Session(KernelBackend& backend, CheckContext& ctx) : backend_(backend), ctx_(ctx) {}
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void* Alloc(size_t bytes);  // zero-filled
  void* UploadBytes(const void* src, size_t bytes);
  template <typename T>
  T* Upload(const std::vector<T>& v) {
    return static_cast<T*>(UploadBytes(v.data(), v.size() * sizeof(T)));
  }
  std::vector<uint8_t> DownloadBytes(const void* src, size_t bytes);
  template <typename T>
  std::vector<T> Download(const T* src, size_t count) {
    std::vector<uint8_t> b = DownloadBytes(src, count * sizeof(T));
    std::vector<T> v(count);
    if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
  KernelBackend& backend() { return backend_; }

 private:
  KernelBackend& backend_;
  CheckContext& ctx_;
  std::vector<void*> buffers_;
};

// Host description of lanes over an arena: CSR block lists with distinct random blocks.
struct LaneSpec {
  BlockLayout layout;
  int32_t num_blocks = 0;
  std::vector<int32_t> offsets, ids, tokens;
  int32_t max_tokens = 0;
  int32_t num_lanes() const { return static_cast<int32_t>(tokens.size()); }
  // (block, slot) of every stored token, lane-major.
  void Rows(std::vector<int32_t>* blocks, std::vector<int32_t>* slots) const;
};

LaneSpec MakeLanes(const BlockLayout& layout, const std::vector<int32_t>& tokens_per_lane,
                   int spare_blocks, std::mt19937& rng);

enum class DataKind { kGaussian, kOutliers };

// n rows of d values: N(0, 1), or N(0, 1) with 4 outlier channels scaled by 20.
std::vector<float> RandomRows(int64_t n, int d, DataKind kind, std::mt19937& rng);
std::vector<uint8_t> ToDType(const std::vector<float>& x, DType dtype);

// Fills every stored token of `lanes` through the reference backend with random K/V.
// Returns the arena bytes.
std::vector<uint8_t> MakeArenaBytes(const LaneSpec& lanes, DataKind kind, std::mt19937& rng);

// Per-token metadata as the service keeps it, dense [num_lanes, max_tokens]. Positions are
// 0..n-1 per lane (shuffled when `shuffle`); scores uniform in [0, 1). Slots past a lane's
// num_tokens hold random garbage that no op may read or write.
std::vector<int32_t> MakePositions(const LaneSpec& lanes, bool shuffle, std::mt19937& rng);
std::vector<float> MakeScores(const LaneSpec& lanes, std::mt19937& rng);

// Values of `got` (the op's output) past each lane's num_tokens differ from `before`
// (bitwise); returns the first such slot, or -1.
int64_t FirstTouchedPadding(const LaneSpec& lanes, const void* before, const void* got,
                            size_t elem_bytes, int rows_per_lane = 1);
// The values of the stored tokens only (lane-major, padding dropped).
std::vector<float> StoredValues(const LaneSpec& lanes, const std::vector<float>& dense);

// Everything an op needs, living in one backend's memory.
struct DeviceLanes {
  PagedArena arena;
  LaneTable table;
};
DeviceLanes UploadLanes(Session& s, const LaneSpec& lanes, const std::vector<uint8_t>& arena);

double Nmse(const std::vector<float>& ref, const std::vector<float>& got);
double MaxAbs(const std::vector<float>& ref, const std::vector<float>& got);

// Largest change of element j's dequantized value when one quantized code (or its f16
// neighbour for raw formats) moves by one step.
float QuantStep(StorageFormat format, int d, const uint8_t* rec, int j);

std::vector<float> DecodeDense(const std::vector<uint8_t>& bytes, DType dtype);

std::string ShapeName(const BlockLayout& l);

// Formats x head dims exercised by the backend checks.
std::vector<StorageFormat> AllFormats();

}  // namespace kvc::kernels::testing
