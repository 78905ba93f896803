// Backend checks of the token ops (write, read, gather, re-rotation) against the reference.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "check_framework.h"
#include "kvc/kernels/rope.h"
#include "kvc/kernels/xxh64.h"
#include "test_support.h"

namespace kvc::kernels::testing {
namespace {

// Distinct random (block, slot) destinations.
void RandomSlots(int32_t n, const BlockLayout& l, int32_t num_blocks, std::mt19937& rng,
                 std::vector<int32_t>* blocks, std::vector<int32_t>* slots) {
  std::vector<int32_t> all(static_cast<size_t>(num_blocks) * l.block_tokens);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  blocks->resize(n);
  slots->resize(n);
  for (int32_t i = 0; i < n; ++i) {
    (*blocks)[i] = all[i] / l.block_tokens;
    (*slots)[i] = all[i] % l.block_tokens;
  }
}

std::vector<uint8_t> RandomBytes(size_t n, std::mt19937& rng) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// Compares arenas written by the reference (want) and the backend (got): quantized records
// of the written slots may differ by one quantization step per element; everything else,
// including untouched bytes, must be identical.
void CompareWrittenArena(CheckContext& ctx, const std::string& what, const BlockLayout& l,
                         std::vector<uint8_t> want, const std::vector<uint8_t>& got,
                         const std::vector<int32_t>& blocks, const std::vector<int32_t>& slots) {
  if (want.size() != got.size()) return ctx.Fail(what + ": arena size");
  int reported = 0;
  for (size_t r = 0; r < blocks.size(); ++r) {
    for (size_t section : {l.key_offset, l.value_offset}) {
      const size_t off = static_cast<size_t>(blocks[r]) * l.block_bytes + section +
                         static_cast<size_t>(slots[r]) * l.record_bytes;
      if (std::memcmp(&want[off], &got[off], l.record_bytes) == 0) continue;
      for (int j = 0; j < l.head_dim; ++j) {
        const float a = DequantizeElement(l.format, l.head_dim, &want[off], j);
        const float b = DequantizeElement(l.format, l.head_dim, &got[off], j);
        // + 1e-6 absolute: GPU fma contraction moves cancelling sums by an ulp of the terms.
        const float tol =
            QuantStep(l.format, l.head_dim, &want[off], j) * 1.001f + 1e-6f * std::fabs(a) + 1e-6f;
        if (!(std::fabs(a - b) <= tol) && reported++ < 5) {
          ctx.Fail(Str(what, ": row ", r, " elem ", j, " want ", a, " got ", b, " tol ", tol));
        }
      }
      std::memcpy(&want[off], &got[off], l.record_bytes);  // accepted; compare the rest exactly
    }
  }
  if (want != got) {
    size_t i = 0;
    while (want[i] == got[i]) ++i;
    ctx.Fail(Str(what, ": arena bytes differ outside the records, first at byte ", i));
  }
}

KVC_BACKEND_CHECK(WriteTokensMatchesReference) {
  std::mt19937 rng(1);
  struct Case {
    int d;
    DType dtype;
    int32_t rows;
    int64_t stride;
  };
  // The long cases are split over the CPU pool's threads even as raw copies (those go in
  // chunks of 256 KiB).
  const Case cases[] = {{128, DType::kF16, 37, 0},  {64, DType::kBF16, 1, 0},
                        {128, DType::kF32, 100, 0}, {64, DType::kF16, 20, 80},
                        {64, DType::kF16, 2500, 0}, {128, DType::kBF16, 1100, 160}};
  for (StorageFormat f : AllFormats()) {
    for (const Case& c : cases) {
      const BlockLayout l = MakeBlockLayout(f, c.d, 16);
      const int32_t num_blocks = std::max(12, c.rows / 16 + 4);
      const std::vector<uint8_t> init =
          RandomBytes(static_cast<size_t>(num_blocks) * l.block_bytes, rng);
      const int64_t stride = c.stride == 0 ? c.d : c.stride;
      const std::vector<uint8_t> k =
          ToDType(RandomRows(c.rows * stride / c.d + 1, c.d, DataKind::kOutliers, rng), c.dtype);
      const std::vector<uint8_t> v =
          ToDType(RandomRows(c.rows * stride / c.d + 1, c.d, DataKind::kGaussian, rng), c.dtype);
      std::vector<int32_t> blocks, slots;
      RandomSlots(c.rows, l, num_blocks, rng, &blocks, &slots);
      std::vector<uint8_t> out[2];
      KernelBackend* backends[2] = {ctx.reference, ctx.backend};
      for (int i = 0; i < 2; ++i) {
        Session s(*backends[i], ctx);
        WriteTokensArgs w;
        w.arena = PagedArena{s.UploadBytes(init.data(), init.size()), l, num_blocks};
        w.num_rows = c.rows;
        w.dtype = c.dtype;
        w.keys = s.Upload(k);
        w.values = s.Upload(v);
        w.row_stride = c.stride;
        w.dst_blocks = s.Upload(blocks);
        w.dst_slots = s.Upload(slots);
        if (!ctx.ExpectOk(backends[i]->WriteTokens(w, StreamHandle{}), "WriteTokens")) return;
        out[i] = s.DownloadBytes(w.arena.base, init.size());
      }
      CompareWrittenArena(ctx,
                          Str("write ", ShapeName(l), " ", DTypeName(c.dtype), " rows ", c.rows), l,
                          out[0], out[1], blocks, slots);
    }
  }
}

KVC_BACKEND_CHECK(ReadTokensMatchesReference) {
  std::mt19937 rng(2);
  for (StorageFormat f : AllFormats()) {
    for (int d : {64, 128}) {
      for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
        const BlockLayout l = MakeBlockLayout(f, d, 16);
        const LaneSpec lanes = MakeLanes(l, {1, 40, 16, 1500}, 2, rng);  // 1557: split
        const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kOutliers, rng);
        std::vector<int32_t> blocks, slots;
        lanes.Rows(&blocks, &slots);
        std::vector<int32_t> perm(blocks.size());
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<int32_t> pb, ps;
        for (int32_t p : perm) pb.push_back(blocks[p]), ps.push_back(slots[p]);
        const int32_t n = static_cast<int32_t>(pb.size());
        const size_t bytes = static_cast<size_t>(n) * d * DTypeSize(dtype);
        std::vector<uint8_t> keys[2], values[2];
        KernelBackend* backends[2] = {ctx.reference, ctx.backend};
        for (int i = 0; i < 2; ++i) {
          Session s(*backends[i], ctx);
          ReadTokensArgs r;
          r.arena = PagedArena{s.UploadBytes(arena.data(), arena.size()), l, lanes.num_blocks};
          r.num_rows = n;
          r.dtype = dtype;
          r.keys = s.Alloc(bytes);
          r.values = s.Alloc(bytes);
          r.src_blocks = s.Upload(pb);
          r.src_slots = s.Upload(ps);
          if (!ctx.ExpectOk(backends[i]->ReadTokens(r, StreamHandle{}), "ReadTokens")) return;
          keys[i] = s.DownloadBytes(r.keys, bytes);
          values[i] = s.DownloadBytes(r.values, bytes);
        }
        const std::string what = Str("read ", ShapeName(l), " as ", DTypeName(dtype));
        if (IsRawFormat(f)) {
          ctx.Expect(keys[0] == keys[1] && values[0] == values[1], what + ": raw bytes exact");
          continue;
        }
        // Same records dequantized: allow one ulp of the output type (fma vs mul+add).
        const float ulp = dtype == DType::kF32   ? 1e-6f
                          : dtype == DType::kF16 ? 1.0f / 1024
                                                 : 1.0f / 128;
        for (auto* pair : {keys, values}) {
          const std::vector<float> a = DecodeDense(pair[0], dtype), b = DecodeDense(pair[1], dtype);
          int bad = 0;
          for (size_t e = 0; e < a.size(); ++e) {
            if (std::fabs(a[e] - b[e]) > ulp * std::fabs(a[e]) + 1e-6f && bad++ < 3) {
              ctx.Fail(Str(what, ": element ", e, " want ", a[e], " got ", b[e]));
            }
          }
        }
      }
    }
  }
}

// ReadRecords is a byte copy: identical to the reference and to the records in the arena
// (those WriteTokens wrote), with keys or values skipped when null and nothing written past
// the last row.
KVC_BACKEND_CHECK(ReadRecordsMatchesReference) {
  std::mt19937 rng(6);
  for (StorageFormat f : AllFormats()) {
    for (int d : {64, 128}) {
      const BlockLayout l = MakeBlockLayout(f, d, 16);
      const LaneSpec lanes = MakeLanes(l, {1, 40, 16}, 2, rng);
      const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kOutliers, rng);
      std::vector<int32_t> blocks, slots;
      lanes.Rows(&blocks, &slots);
      std::vector<int32_t> perm(blocks.size());
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<int32_t> pb, ps;
      for (int32_t p : perm) pb.push_back(blocks[p]), ps.push_back(slots[p]);
      const int32_t n = static_cast<int32_t>(pb.size());
      const size_t rec = l.record_bytes, bytes = (n + 1) * rec;  // one guard row
      const std::vector<uint8_t> guard = RandomBytes(bytes, rng);
      for (int skip = 0; skip < 3; ++skip) {  // 0: both outputs, 1: values only, 2: keys only
        std::vector<uint8_t> keys[2], values[2];
        KernelBackend* backends[2] = {ctx.reference, ctx.backend};
        for (int i = 0; i < 2; ++i) {
          Session s(*backends[i], ctx);
          ReadRecordsArgs r;
          r.arena = PagedArena{s.UploadBytes(arena.data(), arena.size()), l, lanes.num_blocks};
          r.num_rows = n;
          r.keys = skip == 1 ? nullptr : s.UploadBytes(guard.data(), bytes);
          r.values = skip == 2 ? nullptr : s.UploadBytes(guard.data(), bytes);
          r.src_blocks = s.Upload(pb);
          r.src_slots = s.Upload(ps);
          if (!ctx.ExpectOk(backends[i]->ReadRecords(r, StreamHandle{}), "ReadRecords")) return;
          keys[i] = s.DownloadBytes(r.keys, r.keys != nullptr ? bytes : 0);
          values[i] = s.DownloadBytes(r.values, r.values != nullptr ? bytes : 0);
        }
        const std::string what = Str("read records ", ShapeName(l), " skip ", skip);
        ctx.Expect(keys[0] == keys[1] && values[0] == values[1], what + ": bytes exact");
        const PagedArena host{const_cast<uint8_t*>(arena.data()), l, lanes.num_blocks};
        for (int which = 0; which < 2; ++which) {
          const std::vector<uint8_t>& got = which == 0 ? keys[1] : values[1];
          if (got.empty()) continue;
          int bad = 0;
          for (int32_t r = 0; r < n && bad < 3; ++r) {
            const uint8_t* want =
                which == 0 ? KeyRecord(host, pb[r], ps[r]) : ValueRecord(host, pb[r], ps[r]);
            if (std::memcmp(&got[r * rec], want, rec) != 0) {
              ++bad;
              ctx.Fail(Str(what, ": row ", r, which == 0 ? " key" : " value",
                           " record differs from the arena's"));
            }
          }
          ctx.Expect(std::memcmp(&got[n * rec], &guard[n * rec], rec) == 0,
                     what + ": nothing written past the last row");
        }
      }
    }
  }
}

// ChecksumBlocks: for every block listed (in any order, repeats allowed) the XXH64 of its
// bytes, the same as the reference and as Xxh64 over the arena on the host; output past the
// last block untouched.
KVC_BACKEND_CHECK(ChecksumBlocksMatchesReference) {
  std::mt19937 rng(16);
  for (StorageFormat f : AllFormats()) {
    for (int d : {64, 128}) {
      const BlockLayout l = MakeBlockLayout(f, d, 16);
      const LaneSpec lanes = MakeLanes(l, {1, 40, 16}, 2, rng);
      const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kOutliers, rng);
      std::vector<int32_t> ids(static_cast<size_t>(lanes.num_blocks));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      ids.push_back(ids.front());  // a repeat
      const int32_t n = static_cast<int32_t>(ids.size());
      const std::vector<uint64_t> guard(static_cast<size_t>(n) + 1, 0x5a5a5a5a5a5a5a5aull);
      std::vector<uint64_t> got[2];
      KernelBackend* backends[2] = {ctx.reference, ctx.backend};
      for (int i = 0; i < 2; ++i) {
        Session s(*backends[i], ctx);
        ChecksumBlocksArgs a;
        a.arena = PagedArena{s.UploadBytes(arena.data(), arena.size()), l, lanes.num_blocks};
        a.num_blocks = n;
        a.blocks = s.Upload(ids);
        a.checksums = s.Upload(guard);
        if (!ctx.ExpectOk(backends[i]->ChecksumBlocks(a, StreamHandle{}), "ChecksumBlocks")) return;
        got[i] = s.Download(a.checksums, guard.size());
      }
      const std::string what = Str("checksum ", ShapeName(l));
      ctx.Expect(got[0] == got[1], what + ": same as the reference");
      for (int32_t i = 0; i < n; ++i) {
        const uint64_t want =
            Xxh64(arena.data() + static_cast<size_t>(ids[i]) * l.block_bytes, l.block_bytes);
        if (got[1][i] != want) {
          ctx.Fail(Str(what, ": block ", ids[i], " is not XXH64 of its bytes"));
          break;
        }
      }
      ctx.Expect(got[1][n] == guard[n], what + ": nothing written past the last block");
    }
  }
}

// Xxh64 is the xxHash specification's XXH64 (seed 0): libxxhash 0.8.1's answers, lengths
// covering every tail path (0, 1, 3, 32+ with 8-, 4- and 1-byte tails, a 2 KiB block).
KVC_SPEC_CHECK(Xxh64KnownAnswers) {
  struct Case {
    std::string text;
    uint64_t want;
  };
  const Case cases[] = {
      {"", 0xef46db3751d8e999ull},
      {"a", 0xd24ec4f1a98c6e5bull},
      {"abc", 0x44bc2cf5ad770999ull},
      {"Nobody ever got fired for hashing with xxHash.", 0x91373142335357b1ull},
      {"0123456789abcdef0123456789abcdef0123456789", 0xa76190c3acf08a1cull},
  };
  for (const Case& c : cases) {
    ctx.Expect(Xxh64(c.text.data(), c.text.size()) == c.want, Str("XXH64 of '", c.text, "'"));
  }
  std::vector<uint8_t> block(2048);
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<uint8_t>(i * 131 + 7);
  ctx.Expect(Xxh64(block.data(), 2048) == 0xafd8cdfc2fae9426ull, "XXH64 of a 2048-byte block");
  ctx.Expect(Xxh64(block.data(), 2047) == 0x3d8451e546ad6268ull, "XXH64 of 2047 bytes");
  block[1000] ^= 1;
  ctx.Expect(Xxh64(block.data(), 2048) != 0xafd8cdfc2fae9426ull, "one flipped bit changes it");
}

// On one backend: the records ReadRecords returns are the bytes its WriteTokens stored.
KVC_BACKEND_CHECK(ReadRecordsReturnsWrittenRecords) {
  std::mt19937 rng(7);
  for (StorageFormat f : AllFormats()) {
    const BlockLayout l = MakeBlockLayout(f, 128, 16);
    const int32_t num_blocks = 6, n = 50;
    std::vector<int32_t> blocks, slots;
    RandomSlots(n, l, num_blocks, rng, &blocks, &slots);
    const std::vector<uint8_t> k =
        ToDType(RandomRows(n, 128, DataKind::kOutliers, rng), DType::kF16);
    const std::vector<uint8_t> v =
        ToDType(RandomRows(n, 128, DataKind::kGaussian, rng), DType::kF16);
    Session s(*ctx.backend, ctx);
    WriteTokensArgs w;
    w.arena = PagedArena{s.Alloc(num_blocks * l.block_bytes), l, num_blocks};
    w.num_rows = n;
    w.dtype = DType::kF16;
    w.keys = s.Upload(k);
    w.values = s.Upload(v);
    w.dst_blocks = s.Upload(blocks);
    w.dst_slots = s.Upload(slots);
    if (!ctx.ExpectOk(ctx.backend->WriteTokens(w, StreamHandle{}), "WriteTokens")) return;
    ReadRecordsArgs r;
    r.arena = w.arena;
    r.num_rows = n;
    r.keys = s.Alloc(n * l.record_bytes);
    r.values = s.Alloc(n * l.record_bytes);
    r.src_blocks = w.dst_blocks;
    r.src_slots = w.dst_slots;
    if (!ctx.ExpectOk(ctx.backend->ReadRecords(r, StreamHandle{}), "ReadRecords")) return;
    std::vector<uint8_t> arena = s.DownloadBytes(w.arena.base, num_blocks * l.block_bytes);
    const std::vector<uint8_t> keys = s.DownloadBytes(r.keys, n * l.record_bytes);
    const std::vector<uint8_t> values = s.DownloadBytes(r.values, n * l.record_bytes);
    const PagedArena host{arena.data(), l, num_blocks};
    bool same = true;
    for (int32_t i = 0; i < n; ++i) {
      same &= std::memcmp(&keys[i * l.record_bytes], KeyRecord(host, blocks[i], slots[i]),
                          l.record_bytes) == 0;
      same &= std::memcmp(&values[i * l.record_bytes], ValueRecord(host, blocks[i], slots[i]),
                          l.record_bytes) == 0;
    }
    ctx.Expect(same, Str("write then read records ", ShapeName(l), ": the stored bytes"));
  }
}

KVC_BACKEND_CHECK(GatherMatchesReference) {
  std::mt19937 rng(3);
  for (StorageFormat f : {StorageFormat::kF16, StorageFormat::kInt4G32, StorageFormat::kNvfp4,
                          StorageFormat::kFp8E4M3}) {
    const BlockLayout src_l = MakeBlockLayout(f, 128, 16), dst_l = MakeBlockLayout(f, 128, 32);
    const LaneSpec lanes = MakeLanes(src_l, {70, 5}, 0, rng);
    const std::vector<uint8_t> src = MakeArenaBytes(lanes, DataKind::kGaussian, rng);
    std::vector<int32_t> sb, ss, db, ds;
    lanes.Rows(&sb, &ss);
    RandomSlots(static_cast<int32_t>(sb.size()), dst_l, 4, rng, &db, &ds);
    const std::vector<uint8_t> dst_init = RandomBytes(4 * dst_l.block_bytes, rng);
    std::vector<uint8_t> out[2];
    KernelBackend* backends[2] = {ctx.reference, ctx.backend};
    for (int i = 0; i < 2; ++i) {
      Session s(*backends[i], ctx);
      GatherArgs g;
      g.src = PagedArena{s.UploadBytes(src.data(), src.size()), src_l, lanes.num_blocks};
      g.dst = PagedArena{s.UploadBytes(dst_init.data(), dst_init.size()), dst_l, 4};
      g.num_rows = static_cast<int32_t>(sb.size());
      g.src_blocks = s.Upload(sb);
      g.src_slots = s.Upload(ss);
      g.dst_blocks = s.Upload(db);
      g.dst_slots = s.Upload(ds);
      if (!ctx.ExpectOk(backends[i]->Gather(g, StreamHandle{}), "Gather")) return;
      out[i] = s.DownloadBytes(g.dst.base, dst_init.size());
    }
    ctx.Expect(out[0] == out[1], Str("gather ", StorageFormatName(f), ": bytes exact"));
  }
}

KVC_BACKEND_CHECK(RerotateMatchesReference) {
  std::mt19937 rng(4);
  const StorageFormat formats[] = {StorageFormat::kF32, StorageFormat::kF16, StorageFormat::kInt8,
                                   StorageFormat::kInt4G64, StorageFormat::kNvfp4};
  for (StorageFormat f : formats) {
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptJ}) {
      const BlockLayout l = MakeBlockLayout(f, 128, 16);
      const LaneSpec lanes = MakeLanes(l, {33}, 0, rng);
      const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kGaussian, rng);
      std::vector<int32_t> blocks, slots, deltas;
      lanes.Rows(&blocks, &slots);
      for (size_t i = 0; i < blocks.size(); ++i)
        deltas.push_back(static_cast<int32_t>(rng() % 2000000) - 1000);
      std::vector<uint8_t> out[2];
      KernelBackend* backends[2] = {ctx.reference, ctx.backend};
      for (int i = 0; i < 2; ++i) {
        Session s(*backends[i], ctx);
        RerotateArgs r;
        r.arena = PagedArena{s.UploadBytes(arena.data(), arena.size()), l, lanes.num_blocks};
        r.num_rows = static_cast<int32_t>(blocks.size());
        r.blocks = s.Upload(blocks);
        r.slots = s.Upload(slots);
        r.deltas = s.Upload(deltas);
        r.rope = RopeConfig{500000.0f, style == RopeStyle::kNeox ? 128 : 64, style};
        if (!ctx.ExpectOk(backends[i]->Rerotate(r, StreamHandle{}), "Rerotate")) return;
        out[i] = s.DownloadBytes(r.arena.base, arena.size());
      }
      // Requantization may pick a neighbouring code: compare like a write.
      CompareWrittenArena(
          ctx,
          Str("rerotate ", StorageFormatName(f), style == RopeStyle::kNeox ? " neox" : " gptj"), l,
          out[0], out[1], blocks, slots);
    }
  }
}

// Spec: the public RoPE helpers (kvc/kernels/rope.h) the worker shares.
KVC_SPEC_CHECK(RopeHelpers) {
  ctx.Expect(RopeInvFrequency(10000.0, 128, 0) == 1.0, "pair 0 has frequency 1");
  ctx.Expect(std::fabs(RopeInvFrequency(10000.0, 128, 32) - 0.01) < 1e-15, "10000^(-1/2)");
  ctx.Expect(std::fabs(RopeInvFrequency(500000.0, 64, 31) - std::pow(500000.0, -62.0 / 64)) < 1e-18,
             "theta^(-2i/rd) in double");
  int a, b;
  RopePair(RopeStyle::kNeox, 64, 5, &a, &b);
  ctx.Expect(a == 5 && b == 37, "NeoX pairs (i, i + rd/2)");
  RopePair(RopeStyle::kGptJ, 64, 5, &a, &b);
  ctx.Expect(a == 10 && b == 11, "GPT-J pairs (2i, 2i + 1)");
  // Large positions: the angle is reduced in double, so sin/cos match a long-double
  // computation to float accuracy.
  for (int32_t p : {0, 1, 4095, 1000003, 2000000000}) {
    float s, c;
    RopeSinCos(10000.0f, 128, 3, p, &s, &c);
    const long double angle =
        static_cast<long double>(p) * std::pow(10000.0L, -6.0L / 128) /* i = 3 */;
    ctx.Expect(std::fabs(s - static_cast<float>(std::sin(angle))) < 1e-6f &&
                   std::fabs(c - static_cast<float>(std::cos(angle))) < 1e-6f,
               Str("sin/cos at position ", p));
  }
  // Rotations compose: by p then by q equals by p + q (up to float rounding).
  std::mt19937 rng(8);
  const RopeConfig rope{10000.0f, 0, RopeStyle::kNeox};
  std::vector<float> x = RandomRows(1, 64, DataKind::kGaussian, rng), y = x;
  RopeRotate(rope, 64, 1234, x.data());
  RopeRotate(rope, 64, 5678, x.data());
  RopeRotate(rope, 64, 1234 + 5678, y.data());
  ctx.Expect(Nmse(y, x) < 1e-12, Str("rotations compose, NMSE ", Nmse(y, x)));
}

// Spec: rotating a key written at position p by delta equals writing it at p + delta.
KVC_SPEC_CHECK(RerotateComposesWithRope) {
  std::unique_ptr<KernelBackend> ref;
  if (!ctx.ExpectOk(CreateBackend(BackendKind::kReference, BackendOptions{}, &ref), "create"))
    return;
  std::mt19937 rng(5);
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptJ}) {
    const int d = 64;
    const RopeConfig rope{10000.0f, 32, style};
    const BlockLayout l = MakeBlockLayout(StorageFormat::kF32, d, 16);
    std::vector<uint8_t> arena(l.block_bytes);
    const std::vector<float> x = RandomRows(1, d, DataKind::kGaussian, rng);
    const int32_t p = 123, delta = 45678;
    std::vector<float> at_p = x, at_q = x;
    RopeRotate(rope, d, p, at_p.data());
    RopeRotate(rope, d, p + delta, at_q.data());
    int32_t block = 0, slot = 3;
    WriteTokensArgs w;
    w.arena = PagedArena{arena.data(), l, 1};
    w.num_rows = 1;
    w.dtype = DType::kF32;
    w.keys = at_p.data();
    w.values = at_p.data();
    w.dst_blocks = &block;
    w.dst_slots = &slot;
    ctx.ExpectOk(ref->WriteTokens(w, StreamHandle{}), "write");
    RerotateArgs r;
    r.arena = w.arena;
    r.num_rows = 1;
    r.blocks = &block;
    r.slots = &slot;
    r.deltas = &delta;
    r.rope = rope;
    const std::vector<uint8_t> before = arena;
    ctx.ExpectOk(ref->Rerotate(r, StreamHandle{}), "rerotate");
    std::vector<float> got(d);
    DequantizeRecord(l.format, d, KeyRecord(w.arena, block, slot), got.data());
    ctx.Expect(Nmse(at_q, got) < 1e-10,
               Str("rerotated key differs from RoPE at p + delta, NMSE ", Nmse(at_q, got)));
    // Only that key record changes (the caller moves its own position metadata).
    const size_t key_off = l.key_offset + slot * l.record_bytes;
    std::vector<uint8_t> rest = arena;
    std::memcpy(&rest[key_off], &before[key_off], l.record_bytes);
    ctx.Expect(rest == before, "rerotate writes nothing but the key record");
    ctx.Expect(std::equal(x.begin() + 32, x.end(), got.begin() + 32),
               "dims past rotary_dim untouched");
  }
}

}  // namespace
}  // namespace kvc::kernels::testing
