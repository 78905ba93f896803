#include "cachesvc/core/ops/compress.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/ops/score.h"
#include "cachesvc/core/ops/selection.h"
#include "cachesvc/core/ops/transaction.h"
#include "cachesvc/core/plan/eviction_rule.h"
#include "cachesvc/core/plan/query_model.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

using Eviction = CompressionSpec::Eviction;

// Ranks by scores computed from the request's queries.
bool Scoring(const CompressParams& p) {
  return p.spec.eviction == Eviction::kSnapKv ||
         (p.spec.eviction == Eviction::kH2o && !p.queries.empty());
}

// Checks Expected Attention's query statistics: one entry for every layer, every one with
// covariance or none, finite values.
absl::StatusOr<std::vector<const LayerQueryStats*>> ValidateQueryStats(const CompressParams& p,
                                                                       const PoolGeometry& g) {
  std::vector<const LayerQueryStats*> by_layer(static_cast<size_t>(g.num_layers), nullptr);
  if (p.spec.eviction != Eviction::kExpectedAttention) {
    if (!p.query_stats.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "query_stats were sent but ", EvictionName(p.spec.eviction), " does not use them"));
    }
    return by_layer;
  }
  if (!p.queries.empty()) {
    return absl::InvalidArgumentError(
        "expected_attention scores from query_stats (mean and covariance before RoPE), not "
        "from queries; send query_stats only");
  }
  if (p.query_stats.empty()) {
    return absl::InvalidArgumentError(
        "expected_attention needs query_stats: the mean (and covariance) of the context's "
        "queries before RoPE, per query head, for every layer");
  }
  const size_t mean_size = static_cast<size_t>(g.num_query_heads) * g.head_dim;
  const size_t cov_size = mean_size * g.head_dim;
  const bool with_cov = !p.query_stats.front().covariance.empty();
  for (const LayerQueryStats& q : p.query_stats) {
    if (q.layer < 0 || q.layer >= g.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "query_stats for layer ", q.layer, ": the pool has layers 0..", g.num_layers - 1));
    }
    if (by_layer[static_cast<size_t>(q.layer)] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("query_stats for layer ", q.layer, " were sent twice"));
    }
    if (q.mean.size() != mean_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("query_stats for layer ", q.layer, " have a mean of ", q.mean.size(),
                       " floats; expected ", g.num_query_heads, " query heads x head_dim ",
                       g.head_dim, " = ", mean_size));
    }
    if (q.covariance.empty() == with_cov || (with_cov && q.covariance.size() != cov_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "query_stats for layer ", q.layer, " have a covariance of ", q.covariance.size(),
          " floats; expected ", with_cov ? cov_size : 0, " (", g.num_query_heads,
          " query heads x head_dim^2 on every layer, or none on every layer)"));
    }
    for (absl::Span<const float> values : {q.mean, q.covariance}) {
      for (const float x : values) {
        if (!std::isfinite(x)) {
          return absl::InvalidArgumentError(absl::StrCat("query_stats for layer ", q.layer,
                                                         " hold a non-finite value (", x, ")"));
        }
      }
    }
    by_layer[static_cast<size_t>(q.layer)] = &q;
  }
  for (int l = 0; l < g.num_layers; ++l) {
    if (by_layer[static_cast<size_t>(l)] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("query_stats for layer ", l, " are missing; send one entry per layer"));
    }
  }
  return by_layer;
}

// The tier list after the Compress and where each old tier's tokens enter it.
struct TierChange {
  std::vector<Tier> tiers;
  std::vector<int> entry;  // empty = identity
};

absl::StatusOr<TierChange> NewTiers(const Sequence& seq, const CompressionSpec& spec)
    ABSL_SHARED_LOCKS_REQUIRED(seq.mu()) {
  const SequenceStorage& st = seq.storage();
  TierChange change{st.tiers(), {}};
  const StorageFormat from = st.format();
  change.tiers.front().format = spec.storage_set ? spec.storage : from;
  // A Compress may set the residual on a sequence that has none while its tokens are still
  // raw (prefill in f16, then Compress to INT4 keeping the newest tokens raw). Tokens already
  // quantized are never passed off as raw.
  const int64_t before = st.residual_limit();
  const bool set_residual = spec.residual_tokens > 0 && spec.residual_tokens != before;
  if (set_residual && before > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this sequence already keeps a raw residual of ", before,
        " tokens (set when it was created); a Compress cannot change it: send residual_tokens 0 "
        "or ",
        before));
  }
  if (set_residual && (from != seq.raw_format() || st.ever_lossy())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "residual_tokens keeps the newest tokens raw, but this sequence's tokens ",
        from != seq.raw_format() ? absl::StrCat("are stored in ", kernels::StorageFormatName(from))
                                 : std::string("were stored in a lossy format before"),
        "; set residual_tokens at CreateSequence or in the Compress that first converts the "
        "storage"));
  }
  const int64_t after = set_residual ? spec.residual_tokens : before;
  if (const int64_t protect = ProtectedRecent(spec); protect >= 0 && after > protect) {
    return absl::InvalidArgumentError(
        absl::StrCat("this sequence keeps its newest ", after, " tokens raw, more than the ",
                     protect, " newest tokens ", EvictionName(spec.eviction),
                     " always keeps: use a recent window of at least ", after));
  }
  // The automatic policy keeps evicting after this Compress: the residual must fit in its
  // recent window too, or it would evict raw tokens and leave older quantized ones newest.
  if (const int64_t protect = ProtectedRecent(seq.policy());
      set_residual && protect >= 0 && after > protect) {
    return absl::InvalidArgumentError(absl::StrCat(
        "residual_tokens ", after, " is larger than the newest tokens this sequence's automatic ",
        EvictionName(seq.policy().eviction), " policy always keeps (", protect, "); use at most ",
        protect));
  }
  if (set_residual) {
    change.tiers.push_back(Tier{seq.raw_format(), after});
    change.entry = {1};  // the raw tokens enter the residual; the older ones move on down
  }
  return change;
}

// Stored token-heads and bytes of every layer.
std::vector<LayerCompressResult> Footprint(const Sequence& seq)
    ABSL_SHARED_LOCKS_REQUIRED(seq.mu()) {
  const PoolGeometry& g = seq.geometry();
  std::vector<LayerCompressResult> out(static_cast<size_t>(g.num_layers));
  for (int l = 0; l < g.num_layers; ++l) {
    out[static_cast<size_t>(l)].layer = l;
    for (int h = 0; h < g.num_kv_heads; ++h) {
      for (const Segment& s : seq.storage().lane(l, h)) {
        out[static_cast<size_t>(l)].token_heads_before += s.size();
        out[static_cast<size_t>(l)].bytes_before +=
            static_cast<int64_t>(s.blocks.size()) *
            static_cast<int64_t>(seq.pool()->layout(s.format).block_bytes);
      }
    }
  }
  return out;
}

// New scores of one layer from the request's queries.
absl::StatusOr<std::vector<std::vector<float>>> Score(const Sequence& seq,
                                                      const CompressionSpec& spec,
                                                      const LayerQueries& q, int layer)
    ABSL_SHARED_LOCKS_REQUIRED(seq.mu()) {
  const PoolGeometry& g = seq.geometry();
  const DType dtype = q.dtype.value_or(g.dtype);
  const int64_t n = static_cast<int64_t>(q.positions.size());
  // Engines send [n, query heads, head_dim]; the kernel wants [kv head, group, n, head_dim].
  const size_t row = static_cast<size_t>(g.head_dim) * kernels::DTypeSize(dtype);
  std::vector<uint8_t> transposed(q.queries.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int qh = 0; qh < g.num_query_heads; ++qh) {
      std::memcpy(transposed.data() + (static_cast<size_t>(qh) * n + t) * row,
                  q.queries.data() + (static_cast<size_t>(t) * g.num_query_heads + qh) * row, row);
    }
  }
  ScoreRequest r;
  r.queries = transposed.data();
  r.queries_bytes = transposed.size();
  r.query_dtype = dtype;
  for (int h = 0; h < g.num_kv_heads; ++h)
    r.positions.insert(r.positions.end(), q.positions.begin(), q.positions.end());
  r.window = static_cast<int32_t>(n);
  const bool snapkv = spec.eviction == Eviction::kSnapKv;
  r.pool_kernel = snapkv ? spec.pooling_kernel : 1;
  r.pooling = spec.pooling_avg ? kernels::PoolKind::kAvg : kernels::PoolKind::kMax;
  r.mode = snapkv ? kernels::ScoreMode::kOverwrite : kernels::ScoreMode::kAccumulate;
  return ScoreLayer(seq.pool(), seq.storage(), layer, r);
}

// Expected Attention's new scores of one layer: the query model rotated to the positions
// after the layer's last token.
absl::StatusOr<std::vector<std::vector<float>>> ScoreExpected(const Sequence& seq,
                                                              const CompressionSpec& spec,
                                                              const LayerQueryStats& q, int layer)
    ABSL_SHARED_LOCKS_REQUIRED(seq.mu()) {
  const PoolGeometry& g = seq.geometry();
  QueryModel model = AverageRope(g.rope, g.head_dim, g.num_query_heads, seq.layer_tokens(layer),
                                 spec.future_positions, q.mean, q.covariance);
  ExpectedScoreRequest r;
  r.mean = std::move(model.mean);
  r.cov = std::move(model.cov);
  r.min_position = spec.sinks;
  r.value_norm = spec.value_norm;
  return ScoreLayerExpected(seq.pool(), seq.storage(), layer, r);
}

// Splits one lane's concatenated scores (tiers in order) per tier.
std::vector<std::vector<float>> PerTier(const std::vector<Segment>& lane,
                                        const std::vector<float>& scores) {
  std::vector<std::vector<float>> out;
  size_t at = 0;
  for (const Segment& s : lane) {
    out.emplace_back(scores.begin() + static_cast<std::ptrdiff_t>(at),
                     scores.begin() + static_cast<std::ptrdiff_t>(at + s.positions.size()));
    at += s.positions.size();
  }
  return out;
}

}  // namespace

absl::StatusOr<CompressInputs> ValidateCompress(const CompressParams& p, const PoolGeometry& g) {
  const CompressionSpec& spec = p.spec;
  KVC_RETURN_IF_ERROR(ValidateSpec(spec, g, /*automatic=*/false));
  CompressInputs inputs;
  KVC_ASSIGN_OR_RETURN(inputs.query_stats, ValidateQueryStats(p, g));
  if (spec.eviction == Eviction::kSnapKv && p.queries.empty()) {
    return absl::InvalidArgumentError(
        "snapkv needs queries: the last `window` query vectors of every layer");
  }
  std::vector<const LayerQueries*>& by_layer = inputs.queries;
  by_layer.assign(static_cast<size_t>(g.num_layers), nullptr);
  if (!Scoring(p)) {
    if (!p.queries.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "queries were sent but ", EvictionName(spec.eviction), " does not use them"));
    }
    return inputs;
  }
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
    if (n > kMaxScoringQueries) {  // SnapKV's window is bounded too: this is H2O's bound
      return absl::InvalidArgumentError(absl::StrCat("queries for layer ", q.layer, " have ", n,
                                                     " positions; at most ", kMaxScoringQueries,
                                                     " (the last prompt queries suffice)"));
    }
    if (n < 1 || (spec.eviction == Eviction::kSnapKv && n != spec.window)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "queries for layer ", q.layer, " have ", n, " positions; expected ",
          spec.eviction == Eviction::kSnapKv ? absl::StrCat("snapkv.window = ", spec.window)
                                             : std::string("at least 1 (every prompt query)")));
    }
    const DType dtype = q.dtype.value_or(g.dtype);
    const int64_t expected =
        n * g.num_query_heads * g.head_dim * static_cast<int64_t>(kernels::DTypeSize(dtype));
    if (static_cast<int64_t>(q.queries.size()) != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "queries for layer ", q.layer, " have ", q.queries.size(), " bytes; expected ", n,
          " queries x ", g.num_query_heads, " query heads x head_dim ", g.head_dim, " x ",
          kernels::DTypeSize(dtype), " bytes (", kernels::DTypeName(dtype), ") = ", expected));
    }
    by_layer[static_cast<size_t>(q.layer)] = &q;
  }
  for (int l = 0; l < g.num_layers; ++l) {
    if (by_layer[static_cast<size_t>(l)] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("queries for layer ", l, " are missing; send one entry per layer"));
    }
  }
  return inputs;
}

absl::StatusOr<CompressResult> CompressLocked(Sequence& seq, const CompressParams& p,
                                              const CompressInputs& inputs) {
  const CompressionSpec& spec = p.spec;
  const PoolGeometry& g = seq.geometry();
  const bool expected = spec.eviction == Eviction::kExpectedAttention;
  const bool scoring = Scoring(p) || expected;
  if (spec.eviction == Eviction::kH2o && !scoring && !seq.has_scores()) {
    return absl::FailedPreconditionError(
        "h2o needs accumulated attention scores and this sequence has none: send every prompt "
        "query with Compress, or run Attend first");
  }
  KVC_ASSIGN_OR_RETURN(TierChange tiers, NewTiers(seq, spec));
  SequenceStorage& st = seq.storage();
  CompressResult result;
  result.layers = Footprint(seq);
  const EvictionRule rule = ResolveEviction(spec);
  Transaction tx(seq.pool(), &st, seq.charge());
  int64_t evicted = 0;
  for (int l = 0; l < g.num_layers; ++l) {
    std::vector<std::vector<float>> scores;  // per lane, tiers in order
    if (expected) {
      KVC_ASSIGN_OR_RETURN(
          scores, ScoreExpected(seq, spec, *inputs.query_stats[static_cast<size_t>(l)], l));
    } else if (scoring) {
      KVC_ASSIGN_OR_RETURN(scores, Score(seq, spec, *inputs.queries[static_cast<size_t>(l)], l));
    }
    std::vector<LaneSelection> selection;
    if (rule.evicts()) {
      KVC_ASSIGN_OR_RETURN(selection, SelectLayer(seq.pool()->metadata_backend(), st, l, rule, {},
                                                  scoring ? &scores : nullptr));
    }
    for (int h = 0; h < g.num_kv_heads; ++h) {
      LaneChange change;
      change.old = &st.lane(l, h);
      change.tiers = tiers.tiers;
      change.entry = tiers.entry;
      change.shares = &seq.pool()->shares();
      if (scoring) change.scores = PerTier(*change.old, scores[static_cast<size_t>(h)]);
      if (rule.evicts()) {
        LaneSelection& sel = selection[static_cast<size_t>(h)];
        change.keep = std::move(sel.keep);
        change.delta = std::move(sel.delta);
        evicted += sel.evicted;
      }
      tx.AddLane(st.lane_index(l, h), PlanLane(change, g.block_tokens));
    }
  }
  if (tiers.tiers.size() != st.tiers().size() || tiers.tiers.front().format != st.format()) {
    tx.SetTiers(tiers.tiers);
  }
  KVC_RETURN_IF_ERROR(tx.Execute());
  tx.Commit();
  if (scoring) seq.set_has_scores();
  if (evicted > 0) {
    seq.usage()->evicted_token_heads[static_cast<size_t>(rule.why)].fetch_add(
        evicted, std::memory_order_relaxed);
  }
  seq.SyncUsage();
  const std::vector<LayerCompressResult> after = Footprint(seq);
  for (size_t l = 0; l < after.size(); ++l) {
    LayerCompressResult& r = result.layers[l];
    r.token_heads_after = after[l].token_heads_before;
    r.bytes_after = after[l].bytes_before;
    result.bytes_before += r.bytes_before;
    result.bytes_after += r.bytes_after;
  }
  result.storage = st.format();
  return result;
}

}  // namespace kvc::cachesvc
