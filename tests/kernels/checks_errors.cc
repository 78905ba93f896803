// "An op that returns an error has written nothing" (ops.h), per backend: invalid arguments
// are answered with an error and every output keeps its bytes. Host backends also check the
// contents of index arrays (a bad block id in the LAST row must not let the earlier rows be
// written); the CUDA backend trusts device-resident indices, so it gets scalar errors only.
#include <cstring>
#include <random>

#include "check_framework.h"
#include "test_support.h"

namespace kvc::kernels::testing {
namespace {

struct Fixture {
  Fixture(CheckContext& ctx, std::mt19937& rng)
      : s(*ctx.backend, ctx),
        layout(MakeBlockLayout(StorageFormat::kInt4G32, 64, 16)),
        lanes(MakeLanes(layout, {40, 17}, 1, rng)),
        arena_bytes(MakeArenaBytes(lanes, DataKind::kGaussian, rng)),
        dl(UploadLanes(s, lanes, arena_bytes)) {
    lanes.Rows(&blocks, &slots);
  }
  std::vector<uint8_t> Arena() { return s.DownloadBytes(dl.arena.base, arena_bytes.size()); }

  Session s;
  BlockLayout layout;
  LaneSpec lanes;
  std::vector<uint8_t> arena_bytes;
  DeviceLanes dl;
  std::vector<int32_t> blocks, slots;
};

// Runs `op` and expects an error with every watched buffer unchanged.
class Watch {
 public:
  Watch(CheckContext& ctx, Session& s) : ctx_(ctx), s_(s) {}
  void Add(const void* p, size_t bytes) { bufs_.push_back({p, bytes, s_.DownloadBytes(p, bytes)}); }
  void ExpectRejected(const std::string& what, KernelStatus status) {
    ctx_.Expect(!status.ok(), what + ": accepted");
    for (const Buf& b : bufs_) {
      ctx_.Expect(s_.DownloadBytes(b.p, b.bytes) == b.before, what + ": an output was written");
    }
  }

 private:
  struct Buf {
    const void* p;
    size_t bytes;
    std::vector<uint8_t> before;
  };
  CheckContext& ctx_;
  Session& s_;
  std::vector<Buf> bufs_;
};

KVC_BACKEND_CHECK(ErrorsWriteNothing) {
  std::mt19937 rng(51);
  const bool host = ctx.backend->kind() != BackendKind::kCuda;
  Fixture fx(ctx, rng);
  Session& s = fx.s;
  const BlockLayout& l = fx.layout;
  const int32_t n = static_cast<int32_t>(fx.blocks.size());
  const int32_t num_lanes = fx.lanes.num_lanes(), stride = fx.lanes.max_tokens;
  const std::vector<uint8_t> rows =
      ToDType(RandomRows(n, l.head_dim, DataKind::kGaussian, rng), DType::kF16);

  // WriteTokens: a row stride below head_dim; a slot out of range in the last row (host).
  {
    WriteTokensArgs w;
    w.arena = fx.dl.arena;
    w.num_rows = n;
    w.dtype = DType::kF16;
    w.keys = s.Upload(rows);
    w.values = w.keys;
    w.dst_blocks = s.Upload(fx.blocks);
    w.dst_slots = s.Upload(fx.slots);
    Watch watch(ctx, s);
    watch.Add(w.arena.base, fx.arena_bytes.size());
    WriteTokensArgs bad = w;
    bad.row_stride = l.head_dim - 16;
    watch.ExpectRejected("write with row_stride < head_dim", ctx.backend->WriteTokens(bad, {}));
    if (host) {
      std::vector<int32_t> slots = fx.slots;
      slots.back() = l.block_tokens;
      bad = w;
      bad.dst_slots = s.Upload(slots);
      watch.ExpectRejected("write with a bad last slot", ctx.backend->WriteTokens(bad, {}));
    }
  }
  // ReadTokens / ReadRecords: unknown dtype; misaligned record output; bad last block (host).
  {
    ReadTokensArgs r;
    r.arena = fx.dl.arena;
    r.num_rows = n;
    r.dtype = static_cast<DType>(7);
    r.keys = s.Alloc(static_cast<size_t>(n) * l.head_dim * 4);
    r.src_blocks = s.Upload(fx.blocks);
    r.src_slots = s.Upload(fx.slots);
    ReadRecordsArgs rr;
    rr.arena = fx.dl.arena;
    rr.num_rows = n;
    rr.keys = s.Alloc(static_cast<size_t>(n + 1) * l.record_bytes);
    rr.values = static_cast<uint8_t*>(s.Alloc(static_cast<size_t>(n + 1) * l.record_bytes)) + 2;
    rr.src_blocks = r.src_blocks;
    rr.src_slots = r.src_slots;
    Watch watch(ctx, s);
    watch.Add(r.keys, static_cast<size_t>(n) * l.head_dim * 4);
    watch.Add(rr.keys, static_cast<size_t>(n) * l.record_bytes);
    watch.Add(rr.values, static_cast<size_t>(n) * l.record_bytes);
    watch.ExpectRejected("read with an unknown dtype", ctx.backend->ReadTokens(r, {}));
    watch.ExpectRejected("read records into misaligned values", ctx.backend->ReadRecords(rr, {}));
    if (host) {
      std::vector<int32_t> blocks = fx.blocks;
      blocks.back() = fx.lanes.num_blocks;
      rr.values = nullptr;
      rr.src_blocks = s.Upload(blocks);
      watch.ExpectRejected("read records with a bad last block", ctx.backend->ReadRecords(rr, {}));
    }
  }
  // Gather between formats; Rerotate with an odd rotary_dim.
  {
    const BlockLayout other = MakeBlockLayout(StorageFormat::kF16, 64, 16);
    GatherArgs g;
    g.src = fx.dl.arena;
    g.dst = PagedArena{s.Alloc(4 * other.block_bytes), other, 4};
    g.num_rows = 10;
    g.src_blocks = s.Upload(fx.blocks);
    g.src_slots = s.Upload(fx.slots);
    g.dst_blocks = g.src_blocks;
    g.dst_slots = g.src_slots;
    RerotateArgs r;
    r.arena = fx.dl.arena;
    r.num_rows = n;
    r.blocks = g.src_blocks;
    r.slots = g.src_slots;
    r.deltas = s.Upload(std::vector<int32_t>(n, 5));
    r.rope.rotary_dim = 31;
    Watch watch(ctx, s);
    watch.Add(g.dst.base, 4 * other.block_bytes);
    watch.Add(fx.dl.arena.base, fx.arena_bytes.size());
    watch.ExpectRejected("gather between formats", ctx.backend->Gather(g, {}));
    watch.ExpectRejected("rerotate with an odd rotary_dim", ctx.backend->Rerotate(r, {}));
  }
  // Scores: SnapKV with an even pool kernel, Expected Attention with group 0, a negative
  // min_position or no mean, AccumulateScores with group 0, Select with a negative budget or
  // (host) a lane longer than max_tokens; decode with a group of 65; (host) SnapKV and
  // Expected Attention with a bad block id.
  {
    const std::vector<int32_t> pos = MakePositions(fx.lanes, /*shuffle=*/false, rng);
    const std::vector<float> init = MakeScores(fx.lanes, rng);
    float* scores = s.Upload(init);
    SnapKvScoreArgs sk;
    sk.arena = fx.dl.arena;
    sk.lanes = fx.dl.table;
    sk.window = 4;
    sk.queries = s.Upload(rows);
    sk.query_positions = s.Upload(std::vector<int32_t>(num_lanes * 4, 1000));
    sk.key_positions = s.Upload(pos);
    sk.pool_kernel = 4;
    sk.scores = scores;
    AccumulateScoresArgs acc;
    acc.num_lanes = num_lanes;
    acc.num_tokens = fx.dl.table.num_tokens;
    acc.max_tokens = stride;
    acc.group_size = 0;
    acc.weights = s.Upload(std::vector<float>(static_cast<size_t>(num_lanes) * stride, 1.0f));
    acc.scores = scores;
    SelectArgs sel;
    sel.num_lanes = num_lanes;
    sel.num_tokens = fx.dl.table.num_tokens;
    sel.max_tokens = stride;
    sel.positions = sk.key_positions;
    sel.scores = scores;
    sel.budget = -1;
    sel.keep = s.Upload(std::vector<uint8_t>(static_cast<size_t>(num_lanes) * stride, 9));
    DecodeAttentionArgs da;
    da.arena = fx.dl.arena;
    da.lanes = fx.dl.table;
    da.group_size = 65;
    da.queries = sk.queries;
    da.out = s.Alloc(static_cast<size_t>(num_lanes) * 65 * l.head_dim * 2);
    da.weights = static_cast<float*>(s.Alloc(static_cast<size_t>(num_lanes) * 65 * stride * 4));
    da.scores = scores;
    Watch watch(ctx, s);
    watch.Add(scores, init.size() * 4);
    watch.Add(sel.keep, static_cast<size_t>(num_lanes) * stride);
    watch.Add(da.out, static_cast<size_t>(num_lanes) * 65 * l.head_dim * 2);
    watch.Add(da.weights, static_cast<size_t>(num_lanes) * 65 * stride * 4);
    watch.ExpectRejected("snapkv with an even pool kernel", ctx.backend->SnapKvScore(sk, {}));
    ExpectedAttentionScoreArgs ea;
    ea.arena = fx.dl.arena;
    ea.lanes = fx.dl.table;
    ea.group_size = 2;
    ea.mean = s.Upload(std::vector<float>(static_cast<size_t>(num_lanes) * 2 * l.head_dim, 1.0f));
    ea.key_positions = sk.key_positions;
    ea.min_position = 4;
    ea.scores = scores;
    ExpectedAttentionScoreArgs bad_ea = ea;
    bad_ea.group_size = 0;
    watch.ExpectRejected("expected attention with group 0",
                         ctx.backend->ExpectedAttentionScore(bad_ea, {}));
    bad_ea = ea;
    bad_ea.min_position = -1;
    watch.ExpectRejected("expected attention with min_position -1",
                         ctx.backend->ExpectedAttentionScore(bad_ea, {}));
    bad_ea = ea;
    bad_ea.mean = nullptr;
    watch.ExpectRejected("expected attention without mean",
                         ctx.backend->ExpectedAttentionScore(bad_ea, {}));
    watch.ExpectRejected("accumulate with group 0", ctx.backend->AccumulateScores(acc, {}));
    watch.ExpectRejected("select with a negative budget", ctx.backend->Select(sel, {}));
    watch.ExpectRejected("decode with group 65", ctx.backend->DecodeAttention(da, {}));
    if (host) {
      sel.budget = 3;
      sel.max_tokens = fx.lanes.tokens[1];  // lane 0 has more tokens than that
      watch.ExpectRejected("select with num_tokens > max_tokens", ctx.backend->Select(sel, {}));
      acc.group_size = 1;
      acc.max_tokens = sel.max_tokens;
      watch.ExpectRejected("accumulate with num_tokens > max_tokens",
                           ctx.backend->AccumulateScores(acc, {}));
      std::vector<int32_t> offsets = fx.lanes.offsets;
      offsets.back() += 1;  // the last lane claims a block past the list
      std::vector<int32_t> ids = fx.lanes.ids;
      ids.push_back(fx.lanes.num_blocks);  // out of range
      sk.pool_kernel = 7;
      sk.lanes.block_offsets = s.Upload(offsets);
      sk.lanes.block_ids = s.Upload(ids);
      watch.ExpectRejected("snapkv with a bad block id", ctx.backend->SnapKvScore(sk, {}));
      ea.lanes = sk.lanes;
      watch.ExpectRejected("expected attention with a bad block id",
                           ctx.backend->ExpectedAttentionScore(ea, {}));
    }
  }
}

}  // namespace
}  // namespace kvc::kernels::testing
