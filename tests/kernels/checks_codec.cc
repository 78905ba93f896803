// The CPU backend's record codec (every instruction-set instance: ctest runs these checks
// with the baseline, AVX2 and best instances) must write the same bytes and read the same
// values as the reference, not only stay within one quantization step (checks_tokens.cc, the
// bound other backends meet). Rows hit the corners of each format: rounding ties, zero and
// constant rows, subnormal and huge magnitudes, every head_dim; reads also decode arbitrary
// record bytes (every code, NaN codes, odd scales).
#include <cmath>
#include <cstring>
#include <random>

#include "check_framework.h"
#include "test_support.h"

namespace kvc::kernels::testing {
namespace {

// Rows whose kind cycles with the row index (see the file comment).
std::vector<float> EdgeRows(int n, int d, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small_int(-126, 126), code(0, 125);
  std::vector<float> x(static_cast<size_t>(n) * d);
  for (int r = 0; r < n; ++r) {
    float* row = &x[static_cast<size_t>(r) * d];
    for (int j = 0; j < d; ++j) row[j] = normal(rng);
    switch (r % 9) {
      case 1:  // outlier channels
        for (int j = 0; j < d; j += 7) row[j] *= 40.0f;
        break;
      case 2:  // zeros of both signs
        for (int j = 0; j < d; ++j) row[j] = (j % 3 == 0) ? -0.0f : 0.0f;
        break;
      case 3:  // INT8 ties: amax 127 gives scale 1, so k + 0.5 rounds to even
        for (int j = 0; j < d; ++j) row[j] = static_cast<float>(small_int(rng)) + 0.5f;
        row[d / 2] = 127.0f;
        break;
      case 4:  // tiny: scales and elements near or below FLT_MIN
        for (int j = 0; j < d; ++j) row[j] *= (j % 2 == 0) ? 1e-39f : 1e-30f;
        break;
      case 5:  // huge
        for (int j = 0; j < d; ++j) row[j] *= 1e37f;
        break;
      case 6:  // constant: INT4 groups with max == min
        for (int j = 0; j < d; ++j) row[j] = 0.375f;
        break;
      case 7: {  // FP8 ties: amax 448 gives scale 1; midpoints between neighbouring codes
        for (int j = 0; j < d; ++j) {
          const uint8_t c = static_cast<uint8_t>(code(rng));
          const float mid = 0.5f * (E4M3ToFloat(c) + E4M3ToFloat(static_cast<uint8_t>(c + 1)));
          row[j] = (j % 2 == 0) ? mid : -mid;
        }
        row[0] = 448.0f;
        break;
      }
      case 8:  // E2M1 ties inside blocks: multiples of 0.25 around 2688 (t = 1)
        for (int j = 0; j < d; ++j) row[j] = 0.25f * static_cast<float>(small_int(rng) % 25);
        row[0] = 2688.0f;
        break;
      default:
        break;
    }
  }
  return x;
}

// Dense outputs equal element for element; two NaNs are equal whatever their payloads.
bool SameDense(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, DType dtype,
               size_t* first_bad) {
  if (a.size() != b.size()) return false;
  const size_t n = a.size() / DTypeSize(dtype);
  for (size_t i = 0; i < n; ++i) {
    const size_t w = DTypeSize(dtype);
    if (std::memcmp(&a[i * w], &b[i * w], w) == 0) continue;
    if (std::isnan(LoadElement(a.data(), dtype, i)) && std::isnan(LoadElement(b.data(), dtype, i)))
      continue;
    *first_bad = i;
    return false;
  }
  return true;
}

std::vector<uint8_t> WriteWith(KernelBackend& b, CheckContext& ctx, const BlockLayout& l,
                               int32_t num_blocks, const std::vector<uint8_t>& rows, DType dtype,
                               int32_t n) {
  Session s(b, ctx);
  std::vector<int32_t> blocks(n), slots(n);
  for (int32_t r = 0; r < n; ++r) blocks[r] = r / l.block_tokens, slots[r] = r % l.block_tokens;
  const std::vector<uint8_t> init(static_cast<size_t>(num_blocks) * l.block_bytes, 0xa5);
  WriteTokensArgs w;
  w.arena = PagedArena{s.UploadBytes(init.data(), init.size()), l, num_blocks};
  w.num_rows = n;
  w.dtype = dtype;
  w.keys = s.UploadBytes(rows.data(), rows.size());
  w.values = w.keys;
  w.dst_blocks = s.Upload(blocks);
  w.dst_slots = s.Upload(slots);
  if (!ctx.ExpectOk(b.WriteTokens(w, StreamHandle{}), "WriteTokens")) return {};
  return s.DownloadBytes(w.arena.base, init.size());
}

std::vector<uint8_t> ReadWith(KernelBackend& b, CheckContext& ctx, const BlockLayout& l,
                              int32_t num_blocks, const std::vector<uint8_t>& arena, DType dtype,
                              int32_t n) {
  Session s(b, ctx);
  std::vector<int32_t> blocks(n), slots(n);
  for (int32_t r = 0; r < n; ++r) blocks[r] = r / l.block_tokens, slots[r] = r % l.block_tokens;
  const size_t bytes = static_cast<size_t>(n) * l.head_dim * DTypeSize(dtype);
  ReadTokensArgs r;
  r.arena = PagedArena{s.UploadBytes(arena.data(), arena.size()), l, num_blocks};
  r.num_rows = n;
  r.dtype = dtype;
  r.keys = s.Alloc(bytes);
  r.src_blocks = s.Upload(blocks);
  r.src_slots = s.Upload(slots);
  if (!ctx.ExpectOk(b.ReadTokens(r, StreamHandle{}), "ReadTokens")) return {};
  return s.DownloadBytes(r.keys, bytes);
}

}  // namespace

// Other backends are held to one quantization step (checks_tokens.cc), not bit-exactness.
KVC_CPU_BACKEND_CHECK(CpuCodecIsBitExact) {
  std::mt19937 rng(11);
  const int32_t n = 90;
  for (int d : {16, 48, 64, 128, 192, 256, 512}) {
    const std::vector<float> rows = EdgeRows(n, d, rng);
    for (int fi = 0; fi < kNumStorageFormats; ++fi) {
      const StorageFormat f = static_cast<StorageFormat>(fi);
      if (!FormatSupportsHeadDim(f, d)) continue;
      const BlockLayout l = MakeBlockLayout(f, d, 16);
      const int32_t num_blocks = (n + 15) / 16;
      for (DType in : {DType::kF32, DType::kF16, DType::kBF16}) {
        const std::string what = Str(ShapeName(l), " from ", DTypeName(in));
        const std::vector<uint8_t> input = ToDType(rows, in);
        const std::vector<uint8_t> want =
            WriteWith(*ctx.reference, ctx, l, num_blocks, input, in, n);
        const std::vector<uint8_t> got = WriteWith(*ctx.backend, ctx, l, num_blocks, input, in, n);
        if (want != got) {
          size_t i = 0;
          while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
          ctx.Fail(Str("write ", what, ": bytes differ, first at byte ", i, " (record ",
                       (i % l.block_bytes) / l.record_bytes, " byte ", i % l.record_bytes, ")"));
          continue;
        }
        // Reads of what was written, and of arbitrary bytes, in every output dtype.
        std::vector<uint8_t> noise(want.size());
        for (auto& byte : noise) byte = static_cast<uint8_t>(rng());
        for (const std::vector<uint8_t>* arena :
             {&want, static_cast<const std::vector<uint8_t>*>(&noise)}) {
          for (DType out : {DType::kF32, DType::kF16, DType::kBF16}) {
            const std::vector<uint8_t> a =
                ReadWith(*ctx.reference, ctx, l, num_blocks, *arena, out, n);
            const std::vector<uint8_t> b =
                ReadWith(*ctx.backend, ctx, l, num_blocks, *arena, out, n);
            size_t bad = 0;
            if (!SameDense(a, b, out, &bad)) {
              ctx.Fail(Str("read ", what, arena == &noise ? " (random bytes)" : "", " as ",
                           DTypeName(out), ": element ", bad, " want ",
                           LoadElement(a.data(), out, bad), " got ",
                           LoadElement(b.data(), out, bad)));
            }
          }
        }
      }
    }
  }
}

// Reads of >= 8 MiB take the CPU's streaming-store path; same values as small reads.
KVC_CPU_BACKEND_CHECK(CpuLargeReadIsBitExact) {
  std::mt19937 rng(12);
  const int32_t n = 36000;  // 9 MiB of f16 keys at d 128
  for (StorageFormat f :
       {StorageFormat::kInt4G32, StorageFormat::kNvfp4, StorageFormat::kFp8E4M3}) {
    const BlockLayout l = MakeBlockLayout(f, 128, 16);
    const int32_t num_blocks = (n + 15) / 16;
    const std::vector<uint8_t> input =
        ToDType(RandomRows(n, 128, DataKind::kOutliers, rng), DType::kF32);
    const std::vector<uint8_t> arena =
        WriteWith(*ctx.reference, ctx, l, num_blocks, input, DType::kF32, n);
    for (DType out : {DType::kF16, DType::kF32}) {
      const std::vector<uint8_t> a = ReadWith(*ctx.reference, ctx, l, num_blocks, arena, out, n);
      const std::vector<uint8_t> b = ReadWith(*ctx.backend, ctx, l, num_blocks, arena, out, n);
      size_t bad = 0;
      if (!SameDense(a, b, out, &bad)) {
        ctx.Fail(Str("large read ", ShapeName(l), " as ", DTypeName(out), ": element ", bad));
      }
    }
  }
}

}  // namespace kvc::kernels::testing
