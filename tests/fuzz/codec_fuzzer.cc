// codec_fuzzer: fuzzer bytes as stored token records of every storage format, decoded by
// the CPU backend and by the reference (the specification), which must agree:
//
//   header  byte 0: storage format, byte 1: head_dim, byte 2: output dtype, byte 3: query
//           group size; the rest is payload.
//   1. Arbitrary record bytes (scales and codes as they come, NaN and inf codes included)
//      -> ReadTokens in the chosen dtype: CPU == reference element for element (two NaNs are
//      equal), as the kernel checks (CpuCodecIsBitExact) require for random bytes. Nothing
//      is said about finiteness: a stored f32/f16/bf16 element, an f32 or f16 scale, an E4M3
//      NaN code can each be non-finite, so no format guarantees finite reads of raw bytes.
//   2. The payload as f16 rows -> WriteTokens (quantize) on both backends: identical bytes.
//      Read back as f32, every format guarantees finite values when every input is finite
//      f16: scales are amax / code range (fp8, int8, nvfp4) or (max - min) / 15 and min in
//      f16, which cannot overflow for f16-range inputs (int4), and codes saturate.
//   3. Decode attention over those written records with bounded queries (|q| <= 8): CPU
//      output within the kernel checks' NMSE of the reference's, and finite, when every
//      key's sum_i |q_i k_i| / sqrt(d) is at most 16. That bounds the rounding difference
//      between the backends' dot products (FMA and blocking in the CPU's) to ~1e-5; a
//      bound on |q.k| alone is not enough: large terms that cancel (found by this fuzzer:
//      nvfp4 keys near 65504, logit -1.08) differ by 3e-4 between two correct orders.
// Any disagreement prints what differed and aborts (a finding).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "kvc/kernels/backend.h"
#include "kvc/kernels/block_layout.h"
#include "kvc/kernels/dtype.h"
#include "kvc/kernels/fp_formats.h"

namespace {

using kvc::kernels::BackendKind;
using kvc::kernels::BlockLayout;
using kvc::kernels::DType;
using kvc::kernels::KernelBackend;
using kvc::kernels::PagedArena;
using kvc::kernels::StorageFormat;
using kvc::kernels::StreamHandle;

constexpr int kBlockTokens = 16;
constexpr int kMaxRows = 32;  // two blocks: block edges, and fast enough for 10^6 runs
constexpr int kHeadDims[] = {16, 32, 64, 128};
constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr int kGroups[] = {1, 2, 3, 8};

[[noreturn]] void Finding(const char* what, int format, int d, int detail) {
  std::fprintf(stderr, "codec_fuzzer FINDING: %s (format %s, head_dim %d, detail %d)\n", what,
               kvc::kernels::StorageFormatName(static_cast<StorageFormat>(format)), d, detail);
  std::abort();
}

void Check(const kvc::kernels::KernelStatus& s, const char* op) {
  if (!s.ok()) {
    std::fprintf(stderr, "codec_fuzzer FINDING: %s refused valid arguments: %s\n", op, s.detail);
    std::abort();
  }
}

struct Backends {
  std::unique_ptr<KernelBackend> reference, cpu;
};

const Backends& GetBackends() {
  static const Backends* b = [] {
    auto* out = new Backends;
    kvc::kernels::BackendOptions options;
    options.num_threads = 1;  // the fuzzer runs one input at a time; no pool to spin up
    Check(CreateBackend(BackendKind::kReference, options, &out->reference), "CreateBackend");
    Check(CreateBackend(BackendKind::kCpu, options, &out->cpu), "CreateBackend");
    return out;
  }();
  return *b;
}

// Host memory from a backend (64-byte aligned, as arenas need), freed on scope exit.
class Buffer {
 public:
  Buffer(KernelBackend& b, size_t bytes) : backend_(b), bytes_(bytes) {
    Check(b.Allocate(bytes == 0 ? 64 : bytes, &ptr_), "Allocate");
  }
  Buffer(KernelBackend& b, const void* src, size_t bytes) : Buffer(b, bytes) {
    if (bytes > 0) std::memcpy(ptr_, src, bytes);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { backend_.Free(ptr_); }
  void* get() const { return ptr_; }
  std::vector<uint8_t> bytes() const {
    const auto* p = static_cast<const uint8_t*>(ptr_);
    return std::vector<uint8_t>(p, p + bytes_);
  }

 private:
  KernelBackend& backend_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

float Element(const std::vector<uint8_t>& v, DType dtype, size_t i) {
  float f = 0;
  kvc::kernels::ConvertElements(v.data() + i * kvc::kernels::DTypeSize(dtype), dtype, &f,
                                DType::kF32, 1);
  return f;
}

// Element for element; two NaNs are equal whatever their payloads.
bool SameDense(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, DType dtype) {
  const size_t w = kvc::kernels::DTypeSize(dtype);
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size() / w; ++i) {
    if (std::memcmp(&a[i * w], &b[i * w], w) == 0) continue;
    if (std::isnan(Element(a, dtype, i)) && std::isnan(Element(b, dtype, i))) continue;
    return false;
  }
  return true;
}

struct Rows {
  std::vector<int32_t> blocks, slots;
  explicit Rows(int n) : blocks(n), slots(n) {
    for (int r = 0; r < n; ++r) blocks[r] = r / kBlockTokens, slots[r] = r % kBlockTokens;
  }
};

// Dense keys of `n` rows of `arena` (one buffer of layout `l`) in `dtype`.
std::vector<uint8_t> Read(KernelBackend& b, const BlockLayout& l, const std::vector<uint8_t>& arena,
                          int n, DType dtype) {
  const Rows rows(n);
  Buffer a(b, arena.data(), arena.size());
  Buffer out(b, static_cast<size_t>(n) * l.head_dim * kvc::kernels::DTypeSize(dtype));
  kvc::kernels::ReadTokensArgs r;
  r.arena = PagedArena{a.get(), l, static_cast<int32_t>(arena.size() / l.block_bytes)};
  r.num_rows = n;
  r.dtype = dtype;
  r.keys = out.get();
  r.src_blocks = rows.blocks.data();
  r.src_slots = rows.slots.data();
  Check(b.ReadTokens(r, StreamHandle{}), "ReadTokens");
  return out.bytes();
}

// The arena after writing `n` f16 rows as keys and values.
std::vector<uint8_t> Write(KernelBackend& b, const BlockLayout& l, int num_blocks,
                           const std::vector<uint16_t>& f16, int n) {
  const Rows rows(n);
  const std::vector<uint8_t> init(static_cast<size_t>(num_blocks) * l.block_bytes, 0xa5);
  Buffer a(b, init.data(), init.size());
  Buffer in(b, f16.data(), f16.size() * 2);
  kvc::kernels::WriteTokensArgs w;
  w.arena = PagedArena{a.get(), l, num_blocks};
  w.num_rows = n;
  w.dtype = DType::kF16;
  w.keys = in.get();
  w.values = in.get();
  w.dst_blocks = rows.blocks.data();
  w.dst_slots = rows.slots.data();
  Check(b.WriteTokens(w, StreamHandle{}), "WriteTokens");
  return a.bytes();
}

struct Attention {
  std::vector<float> out, lse;
};

// One lane per group of queries, every lane holding all `n` written tokens.
Attention Decode(KernelBackend& b, const BlockLayout& l, const std::vector<uint8_t>& arena, int n,
                 int lanes, int group, const std::vector<float>& q) {
  const int blocks_per_lane = (n + kBlockTokens - 1) / kBlockTokens;
  std::vector<int32_t> offsets(lanes + 1), ids, tokens(lanes, n);
  for (int i = 0; i < lanes; ++i) {
    offsets[i + 1] = offsets[i] + blocks_per_lane;
    for (int k = 0; k < blocks_per_lane; ++k) ids.push_back(k);
  }
  Buffer a(b, arena.data(), arena.size());
  Buffer queries(b, q.data(), q.size() * 4);
  Buffer out(b, q.size() * 4);
  Buffer lse(b, static_cast<size_t>(lanes) * group * 4);
  kvc::kernels::DecodeAttentionArgs d;
  d.arena = PagedArena{a.get(), l, static_cast<int32_t>(arena.size() / l.block_bytes)};
  d.lanes.num_lanes = lanes;
  d.lanes.block_offsets = offsets.data();
  d.lanes.block_ids = ids.data();
  d.lanes.num_tokens = tokens.data();
  d.lanes.max_tokens = n;
  d.group_size = group;
  d.dtype = DType::kF32;
  d.queries = queries.get();
  d.out = out.get();
  d.lse = static_cast<float*>(lse.get());
  Check(b.DecodeAttention(d, StreamHandle{}), "DecodeAttention");
  Attention r;
  r.out.resize(q.size());
  r.lse.resize(static_cast<size_t>(lanes) * group);
  std::memcpy(r.out.data(), out.get(), r.out.size() * 4);
  std::memcpy(r.lse.data(), lse.get(), r.lse.size() * 4);
  return r;
}

double Nmse(const std::vector<float>& want, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    den += double{want[i]} * want[i];
  }
  return den == 0 ? num : num / den;
}

// Step 3's precondition: max over queries and written keys of sum_i |q_i k_i| / sqrt(d).
double MaxAbsLogitTerms(const std::vector<float>& q, const std::vector<float>& keys, int n, int d) {
  double m = 0;
  for (size_t qi = 0; qi < q.size() / d; ++qi) {
    for (int t = 0; t < n; ++t) {
      double sum = 0;
      for (int e = 0; e < d; ++e) sum += std::fabs(double{q[qi * d + e]} * keys[t * d + e]);
      m = std::max(m, sum / std::sqrt(static_cast<double>(d)));
    }
  }
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const int format = data[0] % kvc::kernels::kNumStorageFormats;
  const int d = kHeadDims[data[1] % 4];
  const DType dtype = kDTypes[data[2] % 3];
  const int group = kGroups[data[3] % 4];
  const auto f = static_cast<StorageFormat>(format);
  if (!kvc::kernels::FormatSupportsHeadDim(f, d)) return 0;
  data += 4;
  size -= 4;
  const BlockLayout l = kvc::kernels::MakeBlockLayout(f, d, kBlockTokens);
  const Backends& b = GetBackends();

  // 1. Arbitrary record bytes: every key record of the first rows, the rest zero.
  {
    const int n = std::min<int>(kMaxRows, static_cast<int>(size / l.record_bytes) + 1);
    const int num_blocks = (n + kBlockTokens - 1) / kBlockTokens;
    std::vector<uint8_t> arena(static_cast<size_t>(num_blocks) * l.block_bytes, 0);
    for (int r = 0; r < n; ++r) {
      uint8_t* rec = arena.data() + static_cast<size_t>(r / kBlockTokens) * l.block_bytes +
                     l.key_offset + static_cast<size_t>(r % kBlockTokens) * l.record_bytes;
      const size_t from = static_cast<size_t>(r) * l.record_bytes;
      if (from < size) std::memcpy(rec, data + from, std::min<size_t>(l.record_bytes, size - from));
    }
    if (!SameDense(Read(*b.reference, l, arena, n, dtype), Read(*b.cpu, l, arena, n, dtype),
                   dtype)) {
      Finding("ReadTokens of raw records: CPU differs from the reference", format, d, n);
    }
  }

  // 2. The payload as finite f16 rows (non-finite halves become 0), quantized by both.
  const int n = std::min<int>(kMaxRows, static_cast<int>(size / (2 * d)));
  if (n == 0) return 0;
  std::vector<uint16_t> f16(static_cast<size_t>(n) * d);
  std::memcpy(f16.data(), data, f16.size() * 2);
  for (uint16_t& h : f16)
    if ((h & 0x7c00u) == 0x7c00u) h = 0;
  const int num_blocks = (n + kBlockTokens - 1) / kBlockTokens;
  const std::vector<uint8_t> written = Write(*b.reference, l, num_blocks, f16, n);
  if (written != Write(*b.cpu, l, num_blocks, f16, n)) {
    Finding("WriteTokens: CPU bytes differ from the reference", format, d, n);
  }
  const std::vector<uint8_t> back = Read(*b.reference, l, written, n, DType::kF32);
  if (!SameDense(back, Read(*b.cpu, l, written, n, DType::kF32), DType::kF32)) {
    Finding("ReadTokens of written records: CPU differs from the reference", format, d, n);
  }
  std::vector<float> keys(back.size() / 4);
  std::memcpy(keys.data(), back.data(), back.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!std::isfinite(keys[i])) {
      Finding("a record written from finite f16 reads back non-finite", format, d,
              static_cast<int>(i));
    }
  }

  // 3. Decode attention: queries from the payload's tail, bounded to [-8, 8].
  const size_t used = f16.size() * 2;
  const int lanes = 2;
  std::vector<float> q(static_cast<size_t>(lanes) * group * d);
  for (size_t i = 0; i < q.size(); ++i) {
    const size_t at = used + i;
    q[i] = at < size ? static_cast<float>(static_cast<int8_t>(data[at])) / 16.0f : 0.0f;
  }
  if (MaxAbsLogitTerms(q, keys, n, d) > 16) return 0;
  const Attention want = Decode(*b.reference, l, written, n, lanes, group, q);
  const Attention got = Decode(*b.cpu, l, written, n, lanes, group, q);
  for (size_t i = 0; i < got.out.size(); ++i) {
    if (!std::isfinite(got.out[i]) || !std::isfinite(want.out[i])) {
      Finding("decode attention output is not finite", format, d, static_cast<int>(i));
    }
  }
  // The kernel checks' bound for f32 queries and output (checks_attention.cc).
  if (!(Nmse(want.out, got.out) < 1e-9)) {
    Finding("decode attention: CPU output NMSE vs the reference >= 1e-9", format, d, n);
  }
  for (size_t r = 0; r < want.lse.size(); ++r) {
    if (!(std::fabs(want.lse[r] - got.lse[r]) <= 1e-4f * (1.0f + std::fabs(want.lse[r])))) {
      std::fprintf(stderr, "lse[%zu]: reference %.9g, CPU %.9g\n", r, want.lse[r], got.lse[r]);
      Finding("decode attention: CPU log-normalizer differs from the reference", format, d,
              static_cast<int>(r));
    }
  }
  return 0;
}
