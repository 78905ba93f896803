#include "bench_cases.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "kvc/kernels/record_codec.h"

namespace kvc::kernels::bench {
namespace {

// Buffers in a backend's memory, freed with the owner.
class Buffers {
 public:
  explicit Buffers(KernelBackend& b) : b_(b) {}
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    for (void* p : ptrs_) b_.Free(p);
  }
  void* Upload(const void* src, size_t bytes, KernelStatus* st) {
    void* p = nullptr;
    if (!st->ok()) return nullptr;
    *st = b_.Allocate(std::max<size_t>(bytes, 64), &p);
    if (!st->ok()) return nullptr;
    ptrs_.push_back(p);
    if (src != nullptr)
      *st = b_.CopyToDevice(p, src, bytes, StreamHandle{});
    else
      *st = b_.Memset(p, 0, bytes, StreamHandle{});
    return p;
  }
  template <typename T>
  T* Upload(const std::vector<T>& v, KernelStatus* st) {
    return static_cast<T*>(Upload(v.data(), v.size() * sizeof(T), st));
  }
  KernelBackend& backend() { return b_; }

 private:
  KernelBackend& b_;
  std::vector<void*> ptrs_;
};

struct Geometry {
  int lanes, tokens, d, group;
};
Geometry GeometryFor(BenchSize size) {
  // Small: 8 kv heads x 4096 tokens (16 MiB of f16 K+V). Large: 32 lanes x 32768 tokens
  // (512 MiB of f16 K+V), enough to saturate HBM.
  return size == BenchSize::kSmall ? Geometry{8, 4096, 128, 4} : Geometry{32, 32768, 128, 4};
}

// Fast pseudo-random f16 values in [-2, 2) (xorshift; the large GPU cases need ~10^9).
std::vector<uint16_t> RandomHalf(size_t n, std::mt19937& rng) {
  uint64_t x = rng() | 1;
  std::vector<uint16_t> v(n);
  for (auto& h : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    h = FloatToHalf(static_cast<float>(static_cast<int32_t>(x >> 40) - (1 << 23)) *
                    (1.0f / (1 << 22)));
  }
  return v;
}

// A paged arena holding `lanes` lanes of `tokens` tokens, filled by the backend itself.
struct Paged {
  PagedArena arena;
  LaneTable table;
  std::vector<int32_t> blocks, slots;  // every stored token, lane-major (host copies)
};

Paged MakePaged(Buffers& buf, StorageFormat f, const Geometry& g, KernelStatus* st) {
  Paged p;
  const BlockLayout l = MakeBlockLayout(f, g.d, 16);
  const int per_lane = (g.tokens + 15) / 16;
  const int32_t num_blocks = g.lanes * per_lane;
  std::vector<int32_t> ids(num_blocks), offsets(g.lanes + 1), tokens(g.lanes, g.tokens);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(5);
  std::shuffle(ids.begin(), ids.end(), rng);  // lanes' blocks scattered over the arena
  for (int i = 0; i <= g.lanes; ++i) offsets[i] = i * per_lane;
  for (int lane = 0; lane < g.lanes; ++lane) {
    for (int t = 0; t < g.tokens; ++t) {
      p.blocks.push_back(ids[lane * per_lane + t / 16]);
      p.slots.push_back(t % 16);
    }
  }
  p.arena =
      PagedArena{buf.Upload(/*src=*/nullptr, static_cast<size_t>(num_blocks) * l.block_bytes, st),
                 l, num_blocks};
  p.table = LaneTable{g.lanes, buf.Upload(offsets, st), buf.Upload(ids, st), buf.Upload(tokens, st),
                      g.tokens};
  const size_t rows = p.blocks.size();
  const std::vector<uint16_t> kv = RandomHalf(rows * g.d, rng);
  WriteTokensArgs w;
  w.arena = p.arena;
  w.num_rows = static_cast<int32_t>(rows);
  w.dtype = DType::kF16;
  w.keys = buf.Upload(kv, st);
  w.values = w.keys;
  w.dst_blocks = buf.Upload(p.blocks, st);
  w.dst_slots = buf.Upload(p.slots, st);
  if (st->ok()) *st = buf.backend().WriteTokens(w, StreamHandle{});
  if (st->ok()) *st = buf.backend().Synchronize(StreamHandle{});
  return p;
}

class WriteRun : public BenchRun {
 public:
  WriteRun(KernelBackend& b, StorageFormat f, const Geometry& g, KernelStatus* st) : buf_(b) {
    const BlockLayout l = MakeBlockLayout(f, g.d, 16);
    const int rows = g.lanes * g.tokens;
    std::mt19937 rng(1);
    std::vector<int32_t> blocks(rows), slots(rows);
    // Appends: each lane's tokens fill consecutive slots of its blocks; the blocks are
    // scattered over the arena (as after many allocations and frees).
    std::vector<int32_t> block_of(rows / 16);
    std::iota(block_of.begin(), block_of.end(), 0);
    std::shuffle(block_of.begin(), block_of.end(), rng);
    for (int r = 0; r < rows; ++r) blocks[r] = block_of[r / 16], slots[r] = r % 16;
    args_.arena =
        PagedArena{buf_.Upload(/*src=*/nullptr, static_cast<size_t>(rows / 16) * l.block_bytes, st),
                   l, rows / 16};
    args_.num_rows = rows;
    args_.dtype = DType::kF16;
    args_.keys = buf_.Upload(RandomHalf(static_cast<size_t>(rows) * g.d, rng), st);
    args_.values = buf_.Upload(RandomHalf(static_cast<size_t>(rows) * g.d, rng), st);
    args_.dst_blocks = buf_.Upload(blocks, st);
    args_.dst_slots = buf_.Upload(slots, st);
    bytes_ = static_cast<double>(rows) * (2.0 * g.d * 2 + 2.0 * l.record_bytes);
  }
  KernelStatus Run() override { return buf_.backend().WriteTokens(args_, StreamHandle{}); }
  double Bytes() const override { return bytes_; }
  const char* Counted() const override { return "f16 K+V read + K+V records written"; }

 private:
  Buffers buf_;
  WriteTokensArgs args_;
  double bytes_;
};

class ReadRun : public BenchRun {
 public:
  ReadRun(KernelBackend& b, StorageFormat f, const Geometry& g, KernelStatus* st) : buf_(b) {
    Paged p = MakePaged(buf_, f, g, st);
    const size_t rows = p.blocks.size();
    args_.arena = p.arena;
    args_.num_rows = static_cast<int32_t>(rows);
    args_.dtype = DType::kF16;
    args_.keys = buf_.Upload(/*src=*/nullptr, rows * g.d * 2, st);
    args_.values = buf_.Upload(/*src=*/nullptr, rows * g.d * 2, st);
    args_.src_blocks = buf_.Upload(p.blocks, st);
    args_.src_slots = buf_.Upload(p.slots, st);
    bytes_ = static_cast<double>(rows) * (2.0 * g.d * 2 + 2.0 * p.arena.layout.record_bytes);
  }
  KernelStatus Run() override { return buf_.backend().ReadTokens(args_, StreamHandle{}); }
  double Bytes() const override { return bytes_; }
  const char* Counted() const override { return "K+V records read + f16 K+V written"; }

 private:
  Buffers buf_;
  ReadTokensArgs args_;
  double bytes_;
};

class ReadRecordsRun : public BenchRun {
 public:
  // Every stored token's K and V records copied out (Fetch in the stored format).
  ReadRecordsRun(KernelBackend& b, StorageFormat f, const Geometry& g, KernelStatus* st) : buf_(b) {
    Paged p = MakePaged(buf_, f, g, st);
    const size_t rows = p.blocks.size(), rec = p.arena.layout.record_bytes;
    args_.arena = p.arena;
    args_.num_rows = static_cast<int32_t>(rows);
    args_.keys = buf_.Upload(/*src=*/nullptr, rows * rec, st);
    args_.values = buf_.Upload(/*src=*/nullptr, rows * rec, st);
    args_.src_blocks = buf_.Upload(p.blocks, st);
    args_.src_slots = buf_.Upload(p.slots, st);
    bytes_ = static_cast<double>(rows) * 2.0 * (2.0 * rec);
  }
  KernelStatus Run() override { return buf_.backend().ReadRecords(args_, StreamHandle{}); }
  double Bytes() const override { return bytes_; }
  const char* Counted() const override { return "K+V records (read + write)"; }

 private:
  Buffers buf_;
  ReadRecordsArgs args_;
  double bytes_;
};

class GatherRun : public BenchRun {
 public:
  // Every token of every lane copied into fresh blocks of a second arena (what Compress does
  // when it repacks a sequence).
  GatherRun(KernelBackend& b, StorageFormat f, const Geometry& g, KernelStatus* st) : buf_(b) {
    Paged p = MakePaged(buf_, f, g, st);
    const size_t rows = p.blocks.size();
    std::vector<int32_t> dst_blocks(rows), dst_slots(rows);
    for (size_t r = 0; r < rows; ++r)
      dst_blocks[r] = static_cast<int32_t>(r / 16), dst_slots[r] = static_cast<int32_t>(r % 16);
    const int32_t dst_num = static_cast<int32_t>((rows + 15) / 16);
    args_.src = p.arena;
    args_.dst = PagedArena{
        buf_.Upload(/*src=*/nullptr, static_cast<size_t>(dst_num) * p.arena.layout.block_bytes, st),
        p.arena.layout, dst_num};
    args_.num_rows = static_cast<int32_t>(rows);
    args_.src_blocks = buf_.Upload(p.blocks, st);
    args_.src_slots = buf_.Upload(p.slots, st);
    args_.dst_blocks = buf_.Upload(dst_blocks, st);
    args_.dst_slots = buf_.Upload(dst_slots, st);
    bytes_ = static_cast<double>(rows) * 2.0 * (2.0 * p.arena.layout.record_bytes);
  }
  KernelStatus Run() override { return buf_.backend().Gather(args_, StreamHandle{}); }
  double Bytes() const override { return bytes_; }
  const char* Counted() const override { return "K+V records (read + write)"; }

 private:
  Buffers buf_;
  GatherArgs args_;
  double bytes_;
};

class AccumulateRun : public BenchRun {
 public:
  // H2O: one decode step's attention weights [lanes, G, tokens] added to the caller's scores
  // (metadata only: no KV memory is touched).
  AccumulateRun(KernelBackend& b, StorageFormat, const Geometry& g, KernelStatus* st) : buf_(b) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(g.lanes) * g.group * g.tokens);
    for (float& x : w) x = uni(rng);
    args_.num_lanes = g.lanes;
    args_.num_tokens = buf_.Upload(std::vector<int32_t>(g.lanes, g.tokens), st);
    args_.max_tokens = g.tokens;
    args_.group_size = g.group;
    args_.weights = buf_.Upload(w, st);
    args_.scores = static_cast<float*>(
        buf_.Upload(/*src=*/nullptr, static_cast<size_t>(g.lanes) * g.tokens * 4, st));
    bytes_ = static_cast<double>(w.size()) * 4 + 2.0 * g.lanes * g.tokens * 4;
  }
  KernelStatus Run() override { return buf_.backend().AccumulateScores(args_, StreamHandle{}); }
  double Bytes() const override { return bytes_; }
  const char* Counted() const override { return "weights read + scores read and written"; }

 private:
  Buffers buf_;
  AccumulateScoresArgs args_;
  double bytes_;
};

class SnapKvRun : public BenchRun {
 public:
  SnapKvRun(KernelBackend& b, StorageFormat f, const Geometry& g, KernelStatus* st) : buf_(b) {
    Paged p = MakePaged(buf_, f, g, st);
    const int window = 32;
    std::mt19937 rng(4);
    std::vector<int32_t> qpos, kpos;
    for (int lane = 0; lane < g.lanes; ++lane) {
      for (int w = 0; w < window; ++w) qpos.push_back(g.tokens - window + w);
      for (int t = 0; t < g.tokens; ++t) kpos.push_back(t);
    }
    args_.arena = p.arena;
    args_.lanes = p.table;
    args_.group_size = g.group;
    args_.window = window;
    args_.query_dtype = DType::kF16;
    args_.queries =
        buf_.Upload(RandomHalf(static_cast<size_t>(g.lanes) * g.group * window * g.d, rng), st);
    args_.query_positions = buf_.Upload(qpos, st);
    args_.key_positions = buf_.Upload(kpos, st);
    args_.scores = static_cast<float*>(buf_.Upload(/*src=*/nullptr, kpos.size() * 4, st));
    args_.pool_kernel = 7;
    args_.pool = PoolKind::kMax;
    bytes_ = static_cast<double>(g.lanes) * g.tokens * p.arena.layout.record_bytes;
    flops_ = 2.0 * g.lanes * g.group * window * static_cast<double>(g.tokens) * g.d;  // q.k
  }
  KernelStatus Run() override { return buf_.backend().SnapKvScore(args_, StreamHandle{}); }
  double Bytes() const override { return bytes_; }
  double Flops() const override { return flops_; }
  const char* Counted() const override {
    return "K records read once (compute-bound: G x 32 queries per key)";
  }

 private:
  Buffers buf_;
  SnapKvScoreArgs args_;
  double bytes_, flops_;
};

class DecodeRun : public BenchRun {
 public:
  DecodeRun(KernelBackend& b, StorageFormat f, const Geometry& g, KernelStatus* st) : buf_(b) {
    Paged p = MakePaged(buf_, f, g, st);
    std::mt19937 rng(6);
    args_.arena = p.arena;
    args_.lanes = p.table;
    args_.group_size = g.group;
    args_.dtype = DType::kF16;
    args_.queries = buf_.Upload(RandomHalf(static_cast<size_t>(g.lanes) * g.group * g.d, rng), st);
    args_.out = buf_.Upload(/*src=*/nullptr, static_cast<size_t>(g.lanes) * g.group * g.d * 2, st);
    bytes_ = static_cast<double>(g.lanes) * g.tokens * 2.0 * p.arena.layout.record_bytes;
  }
  KernelStatus Run() override { return buf_.backend().DecodeAttention(args_, StreamHandle{}); }
  double Bytes() const override { return bytes_; }
  const char* Counted() const override { return "K+V records read (the roofline's bytes)"; }

 private:
  Buffers buf_;
  DecodeAttentionArgs args_;
  double bytes_;
};

class CopyRun : public BenchRun {
 public:
  CopyRun(KernelBackend& b, double bytes, int threads, KernelStatus* st)
      : buf_(b), threads_(threads) {
    n_ = static_cast<size_t>(bytes / 2);
    src_ = buf_.Upload(/*src=*/nullptr, n_, st);
    dst_ = buf_.Upload(/*src=*/nullptr, n_, st);
    if (st->ok()) *st = b.Memset(src_, 1, n_, StreamHandle{});
  }
  KernelStatus Run() override {
    if (threads_ <= 1) return buf_.backend().CopyOnDevice(dst_, src_, n_, StreamHandle{});
    std::vector<std::thread> ts;
    const size_t part = (n_ / threads_ + 63) / 64 * 64;
    for (int i = 0; i < threads_; ++i) {
      const size_t off = std::min(n_, part * i), len = std::min(n_ - off, part);
      ts.emplace_back([=] {
        std::memcpy(static_cast<char*>(dst_) + off, static_cast<char*>(src_) + off, len);
      });
    }
    for (auto& t : ts) t.join();
    return KernelStatus::Ok();
  }
  double Bytes() const override { return 2.0 * n_; }
  const char* Counted() const override { return "read + write"; }

 private:
  Buffers buf_;
  int threads_;
  size_t n_ = 0;
  void* src_ = nullptr;
  void* dst_ = nullptr;
};

template <typename Run>
BenchCase Case(const std::string& name, StorageFormat f, BenchSize size) {
  return BenchCase{name + "/" + StorageFormatName(f),
                   [f, size](KernelBackend& b, KernelStatus* st) {
                     return std::unique_ptr<BenchRun>(new Run(b, f, GeometryFor(size), st));
                   }};
}

// One layer of a Llama-3-8B-shaped pool at 32K tokens: 8 kv heads x 32768 tokens, head_dim
// 128, GQA group 4 (32 query heads), SnapKV window 32: 275 GFLOP of q.k over 32 layers.
BenchCase SnapKvLayerCase(StorageFormat f) {
  return BenchCase{std::string("snapkv_llama8b_layer32k/") + StorageFormatName(f),
                   [f](KernelBackend& b, KernelStatus* st) {
                     return std::unique_ptr<BenchRun>(new SnapKvRun(b, f, {8, 32768, 128, 4}, st));
                   }};
}

// One decode step of one layer of a Llama-3-8B-shaped pool at 32K tokens: 8 kv heads x
// 32768 tokens, head_dim 128, GQA group 4 (32 query heads), one query per head.
BenchCase DecodeLayerCase(StorageFormat f) {
  return BenchCase{std::string("decode_llama8b_layer32k/") + StorageFormatName(f),
                   [f](KernelBackend& b, KernelStatus* st) {
                     return std::unique_ptr<BenchRun>(new DecodeRun(b, f, {8, 32768, 128, 4}, st));
                   }};
}

}  // namespace

std::vector<BenchCase> AllCases(BenchSize size) {
  std::vector<BenchCase> cases;
  const StorageFormat quant[] = {StorageFormat::kF16,     StorageFormat::kFp8E4M3,
                                 StorageFormat::kInt8,    StorageFormat::kInt4G32,
                                 StorageFormat::kInt4G64, StorageFormat::kNvfp4};
  for (StorageFormat f : quant) cases.push_back(Case<WriteRun>("quantize", f, size));
  for (StorageFormat f : quant) cases.push_back(Case<ReadRun>("dequantize", f, size));
  for (StorageFormat f : {StorageFormat::kF16, StorageFormat::kInt4G32})
    cases.push_back(Case<ReadRecordsRun>("read_records", f, size));
  for (StorageFormat f : {StorageFormat::kF16, StorageFormat::kInt4G32})
    cases.push_back(Case<GatherRun>("gather", f, size));
  cases.push_back(Case<AccumulateRun>("h2o_accumulate", StorageFormat::kInt4G32, size));
  for (StorageFormat f : {StorageFormat::kF16, StorageFormat::kInt4G32}) {
    cases.push_back(Case<SnapKvRun>("snapkv", f, size));
    cases.push_back(SnapKvLayerCase(f));
  }
  for (StorageFormat f : quant) cases.push_back(Case<DecodeRun>("decode", f, size));
  for (StorageFormat f : {StorageFormat::kF16, StorageFormat::kInt4G32})
    cases.push_back(DecodeLayerCase(f));
  return cases;
}

BenchCase DecodeBatchCase(StorageFormat f, int batch, int tokens) {
  return BenchCase{
      "decode_llama8b_batch" + std::to_string(batch) + "x" + std::to_string(tokens) + "/" +
          StorageFormatName(f),
      [=](KernelBackend& b, KernelStatus* st) {
        return std::unique_ptr<BenchRun>(new DecodeRun(b, f, {8 * batch, tokens, 128, 4}, st));
      }};
}

std::unique_ptr<BenchRun> MakeCopyRun(KernelBackend& backend, double bytes, int threads,
                                      KernelStatus* status) {
  return std::make_unique<CopyRun>(backend, bytes, threads, status);
}

}  // namespace kvc::kernels::bench
