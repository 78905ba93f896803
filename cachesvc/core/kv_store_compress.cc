// Compression inside the service: spec validation, the automatic policies applied on
// append (StreamingLLM, H2O), and the Compress operation (SnapKV / H2O / StreamingLLM
// eviction, storage-format conversion). Eviction is Select + tail-to-hole Compact per
// (layer, kv head) lane; emptied trailing blocks go back to the pool at once.
#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cachesvc/core/kv_store.h"
#include "cachesvc/core/lane_ops.h"
#include "cachesvc/core/residual.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

using Eviction = CompressionSpec::Eviction;

const char* EvictionName(Eviction eviction) {
  switch (eviction) {
    case Eviction::kNone:
      return "none";
    case Eviction::kStreamingLlm:
      return "streaming_llm";
    case Eviction::kSnapKv:
      return "snapkv";
    case Eviction::kH2o:
      return "h2o";
  }
  return "?";
}

absl::Status ValidateSpec(const CompressionSpec& s, const PoolGeometry& g, bool automatic) {
  if (s.storage_set && !kernels::FormatSupportsHeadDim(s.storage, g.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage ", kernels::StorageFormatName(s.storage), " cannot store head_dim ",
                     g.head_dim, " (its quantization groups must tile head_dim)"));
  }
  if (s.residual_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("residual_tokens is ", s.residual_tokens, "; expected >= 0"));
  }
  switch (s.eviction) {
    case Eviction::kNone:
      break;
    case Eviction::kStreamingLlm:
      if (s.sinks < 0 || s.window < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("streaming_llm needs sinks >= 0 and window >= 1; got sinks ", s.sinks,
                         ", window ", s.window));
      }
      if (s.rerotate_keys) {
        if (!g.rope.enabled) {
          return absl::FailedPreconditionError(
              "streaming_llm.rerotate_keys needs the pool's RoPE parameters (geometry.rope)");
        }
      }
      break;
    case Eviction::kSnapKv:
      if (s.window < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("snapkv.window is ", s.window, "; expected >= 1 (paper: 32)"));
      }
      if (s.budget <= s.window) {
        return absl::InvalidArgumentError(
            absl::StrCat("snapkv.budget is ", s.budget, "; it must be larger than window (",
                         s.window, ") so some prompt tokens are selected"));
      }
      if (s.pooling_kernel < 1 || s.pooling_kernel % 2 == 0) {
        return absl::InvalidArgumentError(absl::StrCat("snapkv.pooling_kernel is ",
                                                       s.pooling_kernel,
                                                       "; expected an odd number >= 1 (paper: 7)"));
      }
      if (automatic) {
        return absl::InvalidArgumentError(
            "snapkv needs the observation-window queries, so it cannot be an automatic policy; "
            "apply it with Compress at the end of prefill");
      }
      break;
    case Eviction::kH2o:
      if (s.heavy < 0 || s.recent < 0 || s.heavy + s.recent < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("h2o needs heavy >= 0, recent >= 0 and heavy + recent >= 1; got heavy ",
                         s.heavy, ", recent ", s.recent));
      }
      break;
  }
  const int64_t protect = ProtectedRecent(s);
  if (s.residual_tokens > 0 && protect >= 0 && s.residual_tokens > protect) {
    return absl::InvalidArgumentError(absl::StrCat(
        "residual_tokens (", s.residual_tokens, ") is larger than the newest tokens ",
        EvictionName(s.eviction), " always keeps (", protect,
        "): the raw residual holds the newest tokens, so it must fit in the policy's recent "
        "window (",
        s.eviction == Eviction::kH2o ? "h2o.recent" : "window", ")"));
  }
  return absl::OkStatus();
}

int64_t ProtectedRecent(const CompressionSpec& s) {
  switch (s.eviction) {
    case Eviction::kNone:
      return -1;
    case Eviction::kStreamingLlm:
    case Eviction::kSnapKv:
      return s.window;
    case Eviction::kH2o:
      return s.recent;
  }
  return -1;
}

void KvStore::CountEvicted(const Sequence& seq, Eviction why, int64_t token_heads) {
  if (token_heads > 0)
    (*evicted_[PoolIndex(seq.pool())])[static_cast<int>(why)].fetch_add(token_heads);
}

absl::StatusOr<int64_t> KvStore::EvictLayerLocked(Sequence& seq, int layer, int sinks, int recent,
                                                  int budget, bool rerotate) {
  BlockPool* pool = seq.pool();
  BlockTable& table = seq.table();
  const StorageFormat format = seq.format();
  const BlockTable::LaneArrays lanes = table.Lanes(layer);
  const int num_lanes = table.num_kv_heads();
  if (lanes.max_tokens == 0) return 0;  // nothing stored in this layer: nothing to evict
  const size_t max_tokens = static_cast<size_t>(lanes.max_tokens);
  std::vector<uint8_t> keep(static_cast<size_t>(num_lanes) * max_tokens);
  kernels::SelectArgs select;
  select.arena = pool->arena(format);
  select.lanes = lanes.view();
  select.sinks = sinks;
  // The residual holds the newest tokens of every lane (ValidateSpec: it fits in `recent`),
  // so the low-bit part keeps only the rest of the recent window.
  select.recent = static_cast<int32_t>(std::max<int64_t>(0, recent - seq.residual_tokens(layer)));
  select.budget = budget;
  select.keep = keep.data();
  KVC_RETURN_IF_ERROR(FromKernelStatus(pool->backend()->Select(select, {}), "Select"));
  KVC_ASSIGN_OR_RETURN(const int64_t evicted,
                       CompactLayer(pool, format, table, layer, keep, max_tokens));
  if (evicted > 0) {
    seq.bump_generation();
    if (rerotate) KVC_RETURN_IF_ERROR(CloseGapsLocked(seq, layer));
  }
  return evicted;
}

// StreamingLLM's positions inside the cache: the survivors of each lane get consecutive
// positions ending at the newest one, and their keys are re-rotated by (new - old), which is
// exact for RoPE. Queries and new keys keep their true positions, so every distance the
// model sees stays within the cache span however long the stream runs.
absl::Status KvStore::CloseGapsLocked(Sequence& seq, int layer) {
  BlockPool* pool = seq.pool();
  const PoolGeometry& g = pool->options().geometry;
  const BlockTable* tables[2] = {&seq.table(), &seq.residual()};
  const StorageFormat formats[2] = {seq.format(), seq.raw_format()};
  std::vector<int32_t> blocks[2], slots[2], deltas[2];
  for (int h = 0; h < g.num_kv_heads; ++h) {
    struct Token {
      int32_t position;
      int part;
      int64_t index;
    };
    std::vector<Token> tokens;  // both parts of the lane
    for (int part = 0; part < 2; ++part) {
      const std::vector<int32_t> positions =
          LanePositions(pool, formats[part], *tables[part], layer, h);
      for (size_t i = 0; i < positions.size(); ++i)
        tokens.push_back(Token{positions[i], part, static_cast<int64_t>(i)});
    }
    std::sort(tokens.begin(), tokens.end(),
              [](const Token& a, const Token& b) { return a.position < b.position; });
    const size_t n = tokens.size();
    for (size_t r = 0; r < n; ++r) {
      const int32_t target = tokens.back().position - static_cast<int32_t>(n - 1 - r);
      const int32_t delta = target - tokens[r].position;
      if (delta == 0) continue;
      const Token& t = tokens[r];
      const HeadBlocks& head = tables[t.part]->head(layer, h);
      blocks[t.part].push_back(head.blocks[static_cast<size_t>(t.index / g.block_tokens)]);
      slots[t.part].push_back(static_cast<int32_t>(t.index % g.block_tokens));
      deltas[t.part].push_back(delta);
    }
  }
  for (int part = 0; part < 2; ++part) {
    if (blocks[part].empty()) continue;
    kernels::RerotateArgs a;
    a.arena = pool->arena(formats[part]);
    a.num_rows = static_cast<int32_t>(blocks[part].size());
    a.blocks = blocks[part].data();
    a.slots = slots[part].data();
    a.deltas = deltas[part].data();
    a.rope.theta = static_cast<float>(g.rope.theta);
    a.rope.rotary_dim = g.rope.rotary_dim;
    a.rope.style =
        g.rope.style == RopeStyle::kGptj ? kernels::RopeStyle::kGptJ : kernels::RopeStyle::kNeox;
    a.update_positions = true;
    KVC_RETURN_IF_ERROR(FromKernelStatus(pool->backend()->Rerotate(a, {}), "Rerotate"));
  }
  return absl::OkStatus();
}

absl::Status KvStore::ApplyAutomaticPolicyLocked(Sequence& seq, int layer) {
  const CompressionSpec& spec = seq.policy();
  int sinks = 0, recent = 0, budget = 0;
  switch (spec.eviction) {
    case Eviction::kStreamingLlm:
      sinks = spec.sinks;
      recent = spec.window;
      break;
    case Eviction::kH2o:
      // Without scores every token ranks 0 and H2O would keep the oldest tokens: wait for
      // a scoring Compress (end of prefill) or the first Attend.
      if (!seq.has_scores()) return absl::OkStatus();
      recent = spec.recent;
      budget = spec.heavy;
      break;
    default:
      return absl::OkStatus();
  }
  // Evict once a lane is a whole block over the limit, back down to the limit: memory stays
  // bounded by ceil((limit + block_tokens) / block_tokens) blocks per lane, and the
  // select/compact cost is paid once per block of appended tokens, not per token.
  const int64_t limit = int64_t{sinks} + recent + budget;
  const int bt = seq.pool()->options().geometry.block_tokens;
  int64_t most = 0;
  for (int h = 0; h < seq.table().num_kv_heads(); ++h)
    most = std::max(most, seq.stored_tokens(layer, h));
  if (most <= limit + bt) return absl::OkStatus();
  KVC_ASSIGN_OR_RETURN(
      const int64_t evicted,
      EvictLayerLocked(seq, layer, sinks, recent, budget,
                       spec.eviction == Eviction::kStreamingLlm && spec.rerotate_keys));
  CountEvicted(seq, spec.eviction, evicted);
  return absl::OkStatus();
}

absl::StatusOr<CompressResult> KvStore::Compress(const CompressParams& p) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, FindLive(p.sequence_id));
  BlockPool* pool = seq->pool();
  const PoolGeometry& g = pool->options().geometry;
  const CompressionSpec& spec = p.spec;
  KVC_RETURN_IF_ERROR(ValidateSpec(spec, g, /*automatic=*/false));
  const bool scoring =
      spec.eviction == Eviction::kSnapKv || (spec.eviction == Eviction::kH2o && !p.queries.empty());
  if (spec.eviction == Eviction::kSnapKv && p.queries.empty()) {
    return absl::InvalidArgumentError(
        "snapkv needs queries: the last `window` query vectors of every layer");
  }
  if (!scoring && !p.queries.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("queries were sent but ", EvictionName(spec.eviction), " does not use them"));
  }
  const int group = g.num_query_heads / g.num_kv_heads;
  std::vector<const LayerQueries*> by_layer(static_cast<size_t>(g.num_layers), nullptr);
  if (scoring) {
    for (const LayerQueries& q : p.queries) {
      if (q.layer < 0 || q.layer >= g.num_layers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "queries for layer ", q.layer, ": the pool has layers 0..", g.num_layers - 1));
      }
      if (by_layer[static_cast<size_t>(q.layer)] != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("queries for layer ", q.layer, " were sent twice"));
      }
      const int64_t n = static_cast<int64_t>(q.positions.size());
      if (n < 1 || (spec.eviction == Eviction::kSnapKv && n != spec.window)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "queries for layer ", q.layer, " have ", n, " positions; expected ",
            spec.eviction == Eviction::kSnapKv ? absl::StrCat("snapkv.window = ", spec.window)
                                               : std::string("at least 1 (every prompt query)")));
      }
      const int64_t expected =
          n * g.num_query_heads * g.head_dim * static_cast<int64_t>(kernels::DTypeSize(q.dtype));
      if (static_cast<int64_t>(q.queries.size()) != expected) {
        return absl::InvalidArgumentError(
            absl::StrCat("queries for layer ", q.layer, " have ", q.queries.size(),
                         " bytes; expected ", n, " queries x ", g.num_query_heads,
                         " query heads x head_dim ", g.head_dim, " x ", kernels::DTypeSize(q.dtype),
                         " bytes (", kernels::DTypeName(q.dtype), ") = ", expected));
      }
      by_layer[static_cast<size_t>(q.layer)] = &q;
    }
    for (int l = 0; l < g.num_layers; ++l) {
      if (by_layer[static_cast<size_t>(l)] == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("queries for layer ", l, " are missing; send one entry per layer"));
      }
    }
  }

  kvc::WriterMutexLock lock(&seq->mu());
  if (seq->released()) {
    return absl::NotFoundError(absl::StrCat("sequence '", p.sequence_id, "' was released"));
  }
  if (spec.eviction == Eviction::kH2o && !scoring && !seq->has_scores()) {
    return absl::FailedPreconditionError(
        "h2o needs accumulated attention scores and this sequence has none: send every prompt "
        "query with Compress, or run Attend first");
  }
  BlockTable& table = seq->table();
  const StorageFormat from = seq->format();
  const StorageFormat to = spec.storage_set ? spec.storage : from;
  // The raw residual: a Compress may set it on a sequence that has none while its tokens are
  // still raw (prefill in f16, then Compress to INT4 keeping the newest tokens raw). Tokens
  // already quantized are never passed off as raw.
  const int64_t residual_before = seq->residual_limit();
  const bool set_residual = spec.residual_tokens > 0 && spec.residual_tokens != residual_before;
  if (set_residual && residual_before > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this sequence already keeps a raw residual of ", residual_before,
        " tokens (set when it was created); a Compress cannot change it: send residual_tokens 0 "
        "or ",
        residual_before));
  }
  if (set_residual && from != seq->raw_format()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "residual_tokens keeps the newest tokens raw, but this sequence's tokens are already "
        "stored in ",
        kernels::StorageFormatName(from),
        "; set residual_tokens at CreateSequence or in the Compress that first converts the "
        "storage"));
  }
  const int64_t residual_after = set_residual ? spec.residual_tokens : residual_before;
  if (const int64_t protect = ProtectedRecent(spec); protect >= 0 && residual_after > protect) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this sequence keeps its newest ", residual_after, " tokens raw, more than the ", protect,
        " newest tokens ", EvictionName(spec.eviction),
        " always keeps: use a recent window of at least ", residual_after));
  }
  CompressResult result;
  result.storage = to;
  const auto footprint = [&](int l, int64_t* token_heads,
                             int64_t* bytes) ABSL_SHARED_LOCKS_REQUIRED(seq->mu()) {
    for (int part = 0; part < 2; ++part) {
      const BlockTable& t = part == 0 ? seq->table() : seq->residual();
      const int64_t block = static_cast<int64_t>(
          pool->layout(part == 0 ? seq->format() : seq->raw_format()).block_bytes);
      for (int h = 0; h < g.num_kv_heads; ++h) {
        *token_heads += t.head(l, h).tokens;
        *bytes += static_cast<int64_t>(t.head(l, h).blocks.size()) * block;
      }
    }
  };
  for (int l = 0; l < g.num_layers; ++l) {
    LayerCompressResult r;
    r.layer = l;
    footprint(l, &r.token_heads_before, &r.bytes_before);
    result.layers.push_back(r);
    result.bytes_before += r.bytes_before;
  }

  // 1. Scores (SnapKV overwrites them; H2O's prefill adds to them). Scores rank tokens;
  //    they are not KV data, so a Compress refused later still leaves the KV unchanged.
  if (scoring) {
    std::vector<uint8_t> transposed;
    for (int l = 0; l < g.num_layers; ++l) {
      const LayerQueries& q = *by_layer[static_cast<size_t>(l)];
      const int64_t n = static_cast<int64_t>(q.positions.size());
      // Engines send [n, query heads, head_dim]; the kernel wants [kv head, group, n, dim].
      const size_t row = static_cast<size_t>(g.head_dim) * kernels::DTypeSize(q.dtype);
      transposed.resize(q.queries.size());
      for (int64_t t = 0; t < n; ++t) {
        for (int qh = 0; qh < g.num_query_heads; ++qh) {
          std::memcpy(transposed.data() + (static_cast<size_t>(qh) * n + t) * row,
                      q.queries.data() + (static_cast<size_t>(t) * g.num_query_heads + qh) * row,
                      row);
        }
      }
      std::vector<int32_t> positions;
      for (int h = 0; h < g.num_kv_heads; ++h)
        positions.insert(positions.end(), q.positions.begin(), q.positions.end());
      const BlockTable::LaneArrays lanes = table.Lanes(l);
      if (lanes.max_tokens == 0 && seq->residual_tokens(l) == 0) continue;  // nothing to score
      kernels::SnapKvScoreArgs a;
      a.arena = pool->arena(from);
      a.lanes = lanes.view();
      a.group_size = group;
      a.window = static_cast<int32_t>(n);
      a.query_dtype = q.dtype;
      a.queries = transposed.data();
      a.query_positions = positions.data();
      a.pool_kernel = spec.eviction == Eviction::kSnapKv ? spec.pooling_kernel : 1;
      a.pool = spec.pooling_avg ? kernels::PoolKind::kAvg : kernels::PoolKind::kMax;
      a.mode = spec.eviction == Eviction::kSnapKv ? kernels::ScoreMode::kOverwrite
                                                  : kernels::ScoreMode::kAccumulate;
      if (seq->residual_tokens(l) > 0) {
        KVC_RETURN_IF_ERROR(ScoreWithResidualLocked(*seq, l, a));
      } else {
        KVC_RETURN_IF_ERROR(FromKernelStatus(pool->backend()->SnapKvScore(a, {}), "SnapKvScore"));
      }
    }
    seq->set_has_scores();
  }

  // 2. What survives, per lane, and blocks for a format change: allocated before anything
  //    moves, so a full pool refuses the Compress with the KV data untouched.
  int sinks = 0, recent = 0, budget = 0;
  switch (spec.eviction) {
    case Eviction::kStreamingLlm:
      sinks = spec.sinks;
      recent = spec.window;
      break;
    case Eviction::kSnapKv:
      recent = spec.window;
      budget = spec.budget - spec.window;
      break;
    case Eviction::kH2o:
      recent = spec.recent;
      budget = spec.heavy;
      break;
    case Eviction::kNone:
      break;
  }
  const bool evicting = spec.eviction != Eviction::kNone;
  // Tokens of a lane's low-bit part after eviction (the residual keeps its own).
  auto kept_tokens = [&](int l, int64_t tokens) ABSL_SHARED_LOCKS_REQUIRED(seq->mu()) {
    const int64_t recent_low = std::max<int64_t>(0, recent - seq->residual_tokens(l));
    return evicting ? std::min<int64_t>(tokens, int64_t{sinks} + recent_low + budget) : tokens;
  };
  auto moved_tokens = [&](int l, int64_t tokens) ABSL_SHARED_LOCKS_REQUIRED(seq->mu()) {
    return set_residual ? std::min<int64_t>(residual_after, kept_tokens(l, tokens)) : int64_t{0};
  };
  std::vector<BlockId> residual_blocks;
  if (set_residual) {
    int64_t needed = 0;
    for (int l = 0; l < g.num_layers; ++l) {
      for (int h = 0; h < g.num_kv_heads; ++h)
        needed += BlockTable::CeilDiv(moved_tokens(l, table.head(l, h).tokens), g.block_tokens);
    }
    KVC_RETURN_IF_ERROR(pool->Allocate(seq->raw_format(), needed, &residual_blocks));
  }
  std::vector<BlockId> converted;
  if (to != from) {
    int64_t needed = 0;
    for (int l = 0; l < g.num_layers; ++l) {
      for (int h = 0; h < g.num_kv_heads; ++h) {
        const int64_t t = table.head(l, h).tokens;
        needed += BlockTable::CeilDiv(kept_tokens(l, t) - moved_tokens(l, t), g.block_tokens);
      }
    }
    if (absl::Status st = pool->Allocate(to, needed, &converted); !st.ok()) {
      pool->Free(seq->raw_format(), residual_blocks);
      return st;
    }
  }

  // 3. Evict (select + tail-to-hole compaction; emptied blocks freed at once).
  if (evicting) {
    for (int l = 0; l < g.num_layers; ++l) {
      KVC_ASSIGN_OR_RETURN(
          const int64_t evicted,
          EvictLayerLocked(*seq, l, sinks, recent, budget,
                           spec.eviction == Eviction::kStreamingLlm && spec.rerotate_keys));
      CountEvicted(*seq, spec.eviction, evicted);
    }
  }

  // 4. The newest tokens stay raw in the residual (they are still raw: checked above).
  if (set_residual) {
    for (int l = 0; l < g.num_layers; ++l)
      KVC_RETURN_IF_ERROR(MoveNewestToResidualLocked(*seq, l, residual_after, &residual_blocks));
    KVC_CHECK(residual_blocks.empty()) << "residual blocks allocated but not used";
    seq->set_residual_limit(residual_after);
    seq->bump_generation();
  }

  // 5. Convert the survivors to the new format: dequantize to f32, requantize, keep scores.
  if (to != from) {
    size_t next = 0;
    std::vector<BlockId> old_blocks;
    const kernels::PagedArena src = pool->arena(from);
    const kernels::PagedArena dst = pool->arena(to);
    for (int l = 0; l < g.num_layers; ++l) {
      for (int h = 0; h < g.num_kv_heads; ++h) {
        HeadBlocks& head = table.head(l, h);
        const size_t n = static_cast<size_t>(head.tokens);
        std::vector<BlockId> blocks;
        for (int64_t b = 0; b < BlockTable::CeilDiv(head.tokens, g.block_tokens); ++b)
          blocks.push_back(converted[next++]);
        if (n > 0) {
          std::vector<float> k(n * static_cast<size_t>(g.head_dim)), v(k.size()), scores(n);
          std::vector<int32_t> positions(n), sb(n), ss(n), db(n), ds(n);
          for (size_t t = 0; t < n; ++t) {
            sb[t] = head.blocks[t / static_cast<size_t>(g.block_tokens)];
            ss[t] = static_cast<int32_t>(t % static_cast<size_t>(g.block_tokens));
            db[t] = blocks[t / static_cast<size_t>(g.block_tokens)];
            ds[t] = ss[t];
          }
          kernels::ReadTokensArgs r;
          r.arena = src;
          r.num_rows = static_cast<int32_t>(n);
          r.dtype = DType::kF32;
          r.keys = k.data();
          r.values = v.data();
          r.positions = positions.data();
          r.scores = scores.data();
          r.src_blocks = sb.data();
          r.src_slots = ss.data();
          KVC_CHECK(pool->backend()->ReadTokens(r, {}).ok());
          kernels::WriteTokensArgs w;
          w.arena = dst;
          w.num_rows = static_cast<int32_t>(n);
          w.dtype = DType::kF32;
          w.keys = k.data();
          w.values = v.data();
          w.positions = positions.data();
          w.dst_blocks = db.data();
          w.dst_slots = ds.data();
          KVC_CHECK(pool->backend()->WriteTokens(w, {}).ok());
          // WriteTokens resets scores; H2O rankings must survive the conversion (host arena).
          for (size_t t = 0; t < n; ++t) *kernels::ScorePtr(dst, db[t], ds[t]) = scores[t];
        }
        old_blocks.insert(old_blocks.end(), head.blocks.begin(), head.blocks.end());
        head.blocks = std::move(blocks);
      }
    }
    pool->Free(from, old_blocks);
    seq->set_format(to);
    seq->bump_generation();
  }

  for (int l = 0; l < g.num_layers; ++l) {
    LayerCompressResult& r = result.layers[static_cast<size_t>(l)];
    footprint(l, &r.token_heads_after, &r.bytes_after);
    result.bytes_after += r.bytes_after;
  }
  return result;
}

}  // namespace kvc::cachesvc
