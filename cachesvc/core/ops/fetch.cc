#include "cachesvc/core/ops/fetch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "cachesvc/core/ops/transaction.h"
#include "cachesvc/core/pool/op_stage.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

// Stored indices [begin, end) of one tier of one lane.
struct Range {
  int layer = 0;
  int head = 0;
  int tier = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

struct FetchPlan {
  std::vector<Range> ranges;
  std::vector<int64_t> limit;  // per layer: positions below it are served
  int64_t visible = 0;
  std::vector<uint64_t> generations;  // per layer, when planned
};

absl::StatusOr<std::vector<int>> FetchLayers(const FetchParams& p, const Sequence& seq) {
  const PoolGeometry& g = seq.geometry();
  std::vector<int> layers;
  if (p.layers.empty()) {
    for (int l = 0; l < g.num_layers; ++l) layers.push_back(l);
  }
  // Each layer at most once: a layer named again would be read and sent again, so a request
  // of a few bytes per entry could make the server stream a layer millions of times.
  std::vector<bool> named(static_cast<size_t>(g.num_layers), false);
  for (int64_t l : p.layers) {
    if (l < 0 || l >= g.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("layers contains ", l, ": pool '",
                                                     seq.pool()->options().name, "' has layers 0..",
                                                     g.num_layers - 1));
    }
    if (named[static_cast<size_t>(l)]) {
      return absl::InvalidArgumentError(
          absl::StrCat("layers: ", l, " is named twice; name each layer at most once"));
    }
    named[static_cast<size_t>(l)] = true;
    layers.push_back(static_cast<int>(l));
  }
  return layers;
}

absl::Status Cancelled() {
  return absl::CancelledError("the caller stopped reading the Fetch stream");
}

absl::Status Gone(const Sequence& seq) {
  return absl::NotFoundError(absl::StrCat("sequence ", Quoted(seq.id()), " was released"));
}

FetchPlan PlanFetch(const Sequence& seq, const FetchParams& p, const std::vector<int>& layers,
                    DType dtype) ABSL_SHARED_LOCKS_REQUIRED(seq.mu()) {
  const PoolGeometry& g = seq.geometry();
  const SequenceStorage& st = seq.storage();
  const int64_t chunk_bytes = p.max_chunk_bytes == 0
                                  ? kDefaultChunkBytes
                                  : std::clamp(p.max_chunk_bytes, kMinChunkBytes, kMaxChunkBytes);
  FetchPlan plan;
  plan.visible = seq.visible_tokens();
  for (int l = 0; l < g.num_layers; ++l) plan.generations.push_back(st.generation(l));
  plan.limit.assign(static_cast<size_t>(g.num_layers), plan.visible);
  for (int layer : layers) {
    if (p.include_unfinished) plan.limit[static_cast<size_t>(layer)] = seq.layer_tokens(layer);
    for (int h = 0; h < g.num_kv_heads; ++h) {
      for (int t = 0; t < static_cast<int>(st.tiers().size()); ++t) {
        const Segment& s = st.lane(layer, h)[static_cast<size_t>(t)];
        const int64_t token_bytes =
            p.format == FetchFormat::kStored
                ? static_cast<int64_t>(seq.pool()->layout(s.format).record_bytes)
                : int64_t{g.head_dim} * static_cast<int64_t>(kernels::DTypeSize(dtype));
        const int64_t per_chunk = std::max<int64_t>(1, chunk_bytes / (2 * token_bytes));
        for (int64_t b = 0; b < s.size(); b += per_chunk) {
          plan.ranges.push_back(Range{layer, h, t, b, std::min(s.size(), b + per_chunk)});
        }
      }
    }
  }
  return plan;
}

// Reads one range into `chunk` (the tokens below the layer's limit). False when none are.
absl::StatusOr<bool> ReadRange(const Sequence& seq, const FetchParams& p, const FetchPlan& plan,
                               const Range& r, DType dtype, FetchChunk* chunk)
    ABSL_SHARED_LOCKS_REQUIRED(seq.mu()) {
  const int bt = seq.geometry().block_tokens;
  const Segment& s = seq.storage().lane(r.layer, r.head)[static_cast<size_t>(r.tier)];
  std::vector<int32_t> blocks, slots;
  for (int64_t i = r.begin; i < r.end; ++i) {
    const int32_t pos = s.positions[static_cast<size_t>(i)];
    if (pos >= plan.limit[static_cast<size_t>(r.layer)]) continue;
    chunk->positions.push_back(pos);
    blocks.push_back(s.block_of(i, bt));
    slots.push_back(Segment::slot_of(i, bt));
  }
  const size_t n = blocks.size();
  if (n == 0) return false;
  chunk->layer = r.layer;
  chunk->kv_head = r.head;
  chunk->num_tokens = static_cast<int>(n);
  chunk->dtype = dtype;
  chunk->storage = s.format;
  chunk->visible_tokens = plan.visible;
  BlockPool* pool = seq.pool();
  const kernels::PagedArena arena = pool->arena(s.format);
  OpStage stage(pool);
  if (p.format == FetchFormat::kStored) {
    const size_t rb = arena.layout.record_bytes;
    chunk->record_bytes = static_cast<int>(rb);
    chunk->keys.resize(n * rb);
    chunk->values.resize(n * rb);
    kernels::ReadRecordsArgs a{arena,
                               static_cast<int32_t>(n),
                               stage.Out(chunk->keys.data(), n * rb),
                               stage.Out(chunk->values.data(), n * rb),
                               stage.In(blocks.data(), n),
                               stage.In(slots.data(), n)};
    KVC_RETURN_IF_ERROR(stage.Launch("ReadRecords", [&](kernels::StreamHandle st) {
      return pool->backend()->ReadRecords(a, st);
    }));
  } else {
    const size_t bytes =
        n * static_cast<size_t>(seq.geometry().head_dim) * kernels::DTypeSize(dtype);
    chunk->keys.resize(bytes);
    chunk->values.resize(bytes);
    kernels::ReadTokensArgs a;
    a.arena = arena;
    a.num_rows = static_cast<int32_t>(n);
    a.dtype = dtype;
    a.keys = stage.Out(chunk->keys.data(), bytes);
    a.values = stage.Out(chunk->values.data(), bytes);
    a.src_blocks = stage.In(blocks.data(), n);
    a.src_slots = stage.In(slots.data(), n);
    KVC_RETURN_IF_ERROR(stage.Launch("ReadTokens", [&](kernels::StreamHandle st) {
      return pool->backend()->ReadTokens(a, st);
    }));
  }
  KVC_RETURN_IF_ERROR(stage.Finish());
  return true;
}

}  // namespace

absl::Status FetchSequence(const std::shared_ptr<Sequence>& seq, const FetchParams& p,
                           const FetchSink& sink, const SharedReadCheck& check,
                           std::atomic<int64_t>* fetched_bytes) {
  KVC_ASSIGN_OR_RETURN(const std::vector<int> layers, FetchLayers(p, *seq));
  const DType dtype = p.dtype.value_or(seq->geometry().dtype);
  FetchPlan plan;
  {
    kvc::ReaderMutexLock lock(&seq->mu());
    if (seq->released()) return Gone(*seq);
    // Shared blocks never change bytes (copy-on-write), so what is checked here is what the
    // ranges below read; the generation check covers everything else.
    KVC_RETURN_IF_ERROR(CheckSharedReads(*seq, layers, check));
    plan = PlanFetch(*seq, p, layers, dtype);
  }
  // Each chunk is held back until the next one exists, so the last one can say so.
  FetchChunk held;
  bool holding = false;
  std::vector<int64_t> served(
      static_cast<size_t>(seq->geometry().num_layers * seq->geometry().num_kv_heads), 0);
  auto emit = [&](bool last) {
    held.last = last;
    fetched_bytes->fetch_add(static_cast<int64_t>(held.keys.size() + held.values.size()),
                             std::memory_order_relaxed);
    holding = false;
    return sink(held);
  };
  for (const Range& r : plan.ranges) {
    FetchChunk chunk;
    {
      const Sequence& reader = *seq;  // a reader lock: the const accessors
      kvc::ReaderMutexLock lock(&reader.mu());
      if (reader.released() ||
          reader.storage().generation(r.layer) != plan.generations[static_cast<size_t>(r.layer)]) {
        return absl::AbortedError(absl::StrCat(
            "sequence ", Quoted(seq->id()),
            " was released or compressed (or its stored tokens moved) while this Fetch was "
            "streaming; fetch it again"));
      }
      KVC_ASSIGN_OR_RETURN(const bool any, ReadRange(reader, p, plan, r, dtype, &chunk));
      if (!any) continue;
    }
    int64_t& first = served[static_cast<size_t>(r.layer * seq->geometry().num_kv_heads + r.head)];
    chunk.first_index = first;
    first += chunk.num_tokens;
    if (holding && !emit(false)) return Cancelled();
    held = std::move(chunk);
    holding = true;
  }
  if (holding && !emit(true)) return Cancelled();
  return absl::OkStatus();
}

}  // namespace kvc::cachesvc
