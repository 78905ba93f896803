#include "worker/service/service_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kvc/client/admin_client.h"
#include "worker/engine/attention.h"

namespace kvc::worker {

absl::StatusOr<std::unique_ptr<ServiceKvCache>> ServiceKvCache::Create(
    client::KvCacheClient* client, const std::string& pool, const KvGeometry& geometry,
    const ServicePolicy& policy, bool always_fetch, kernels::ThreadPool* pool_threads,
    const client::Prefix* prefix) {
  auto pools = kvc::client::AdminClient::Over(*client).ListPools();
  if (!pools.ok()) return pools.status();
  const client::PoolInfo* info = nullptr;
  for (const auto& p : *pools) {
    if (pool.empty() ? info == nullptr : p.name == pool) info = &p;
  }
  if (info == nullptr)
    return absl::NotFoundError(absl::StrCat("kvcached has no pool '", pool, "'"));
  const client::PoolGeometry& g = info->geometry;
  if (g.num_layers != geometry.num_layers || g.num_kv_heads != geometry.num_kv_heads ||
      g.num_query_heads != geometry.num_q_heads || g.head_dim != geometry.head_dim) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool '", info->name, "' is shaped ", g.num_layers, " layers x ",
                     g.num_kv_heads, " kv heads (", g.num_query_heads, " query heads) x head_dim ",
                     g.head_dim, " but the model needs ", geometry.num_layers, " x ",
                     geometry.num_kv_heads, " (", geometry.num_q_heads, ") x ", geometry.head_dim));
  }
  if (policy.query_agnostic()) {
    // The service rotates the statistics (taken before RoPE) with the pool's RoPE: it must be
    // the engine's (rotate-half over the whole head, the model's base).
    const client::RopeInfo& rope = g.rope;
    const bool same = rope.enabled && !rope.gptj_style &&
                      (rope.rotary_dim == 0 || rope.rotary_dim == geometry.head_dim) &&
                      std::abs(rope.theta - geometry.rope_theta) <= 1e-6 * geometry.rope_theta;
    if (!same) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Expected Attention needs pool '", info->name, "' to rotate keys as the model does (",
          "RoPE base ", geometry.rope_theta, ", rotate-half over all ", geometry.head_dim,
          " dims); the pool's RoPE: ",
          rope.enabled ? absl::StrCat("base ", rope.theta, rope.gptj_style ? ", GPT-J pairs" : "",
                                      ", rotary dims ", rope.rotary_dim)
                       : std::string("none")));
    }
  }
  std::unique_ptr<ServiceKvCache> store(
      new ServiceKvCache(client, geometry, policy, always_fetch, pool_threads));
  client::CreateSequenceOptions options;
  options.pool = info->name;
  // A label for unauthenticated servers; with credentials the server takes the tenant from
  // them and refuses a request naming another.
  const client::ClientOptions& connection = client->options();
  if (connection.bearer_token.empty() && connection.tls.cert_file.empty()) {
    options.tenant = "kvc-worker";
  }
  options.policy = policy.automatic;
  if (prefix != nullptr) options.prefix = *prefix;
  auto seq = client->CreateSequence(options);
  if (!seq.ok()) return seq.status();
  store->sequence_id_ = seq->sequence_id;
  store->attached_tokens_ = seq->attached_tokens;
  // Attached tokens sit at the engine's positions 0.. (a prefix is named from position 0).
  if (seq->attached_tokens > 0) store->base_position_ = 0;
  return store;
}

absl::StatusOr<std::unique_ptr<ServiceKvCache>> ServiceKvCache::Fork(
    client::KvCacheClient* client, const std::string& source, const KvGeometry& geometry,
    const ServicePolicy& policy, bool always_fetch, kernels::ThreadPool* pool_threads) {
  auto seq = client->ForkSequence(source);
  if (!seq.ok()) return seq.status();
  std::unique_ptr<ServiceKvCache> store(
      new ServiceKvCache(client, geometry, policy, always_fetch, pool_threads));
  store->sequence_id_ = seq->sequence_id;
  store->forked_tokens_ = seq->visible_tokens;
  store->base_position_ = 0;  // the source's tokens sit at the engine's positions 0..
  store->compressed_ = true;  // the source went through the policy already
  return store;
}

ServiceKvCache::~ServiceKvCache() {
  if (!sequence_id_.empty()) (void)client_->Release(sequence_id_);
}

absl::Status ServiceKvCache::Append(int32_t layer, absl::Span<const int32_t> positions,
                                    absl::Span<const float> keys, absl::Span<const float> values) {
  if (positions.empty()) return absl::InvalidArgumentError("Append of zero tokens");
  for (size_t i = 1; i < positions.size(); ++i) {
    if (positions[i] != positions[i - 1] + 1) {
      return absl::InvalidArgumentError(
          "kvcached takes each layer's tokens at consecutive positions");
    }
  }
  if (base_position_ < 0) base_position_ = positions[0];
  if (positions[0] < base_position_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "position ", positions[0], " precedes the sequence's first position ", base_position_));
  }
  client::AppendChunk chunk;
  chunk.sequence_id = sequence_id_;
  chunk.layer = layer;
  chunk.start_position = positions[0] - base_position_;
  chunk.num_tokens = static_cast<int>(positions.size());
  chunk.dtype = client::DType::kF32;
  chunk.keys = keys.data();
  chunk.values = values.data();
  chunk.bytes = keys.size() * sizeof(float);
  if (values.size() != keys.size()) return absl::InvalidArgumentError("keys/values sizes differ");
  auto r = client_->Append(chunk);
  return r.ok() ? absl::OkStatus() : r.status();
}

absl::StatusOr<LayerKv> ServiceKvCache::FetchLayer(int32_t layer, bool include_unfinished) {
  ++fetch_calls_;
  client::FetchOptions options;
  options.layers = {layer};
  options.dtype = client::DType::kF32;
  options.include_unfinished = include_unfinished;
  auto kv = client_->Fetch(sequence_id_, options);
  if (!kv.ok()) return kv.status();
  LayerKv out;
  out.heads.resize(static_cast<size_t>(geometry_.num_kv_heads));
  const size_t d = static_cast<size_t>(geometry_.head_dim);
  for (const client::FetchedHead& h : kv->heads) {
    // After eviction the service's stored order is not position order; the engine's
    // contract wants increasing positions (attention itself does not care).
    const size_t n = h.positions.size();
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return h.positions[a] < h.positions[b]; });
    HeadKv& head = out.heads[static_cast<size_t>(h.kv_head)];
    const auto* k = reinterpret_cast<const float*>(h.keys.data());
    const auto* v = reinterpret_cast<const float*>(h.values.data());
    head.positions.reserve(n);
    head.keys.reserve(n * d);
    head.values.reserve(n * d);
    for (size_t i : order) {
      head.positions.push_back(h.positions[i] + std::max(base_position_, 0));
      head.keys.insert(head.keys.end(), k + i * d, k + (i + 1) * d);
      head.values.insert(head.values.end(), v + i * d, v + (i + 1) * d);
    }
  }
  return out;
}

absl::StatusOr<LayerKv> ServiceKvCache::Fetch(int32_t layer) {
  return FetchLayer(layer, /*include_unfinished=*/true);
}

absl::Status ServiceKvCache::Attend(int32_t layer, absl::Span<const float> queries,
                                    absl::Span<const int32_t> query_positions,
                                    absl::Span<float> out) {
  const size_t row = static_cast<size_t>(geometry_.num_q_heads) * geometry_.head_dim;
  // Prompt queries: every multi-token chunk, and a one-token chunk inside the expected prompt.
  const bool prompt_chunk =
      query_positions.size() > 1 || (prompt_tokens_ > 0 && query_positions.back() < prompt_tokens_);
  if (stats_ && !compressed_ && !given_stats_) {
    // Expected Attention: every prompt (document) query after the sinks, summarized.
    const int64_t point = CompressionPoint();
    if (point > 0) {
      const int32_t first = std::max(base_position_, 0);
      if (auto s = stats_->Add(layer, queries, query_positions, first + policy_.sinks(),
                               static_cast<int32_t>(point));
          !s.ok()) {
        return s;
      }
    }
  } else if (prompt_chunk && policy_.compress_at_prompt_end && !compressed_ &&
             !policy_.query_agnostic()) {
    // Remember the newest prompt queries of this layer for SnapKV's observation window.
    auto& q = window_queries_[static_cast<size_t>(layer)];
    auto& p = window_positions_[static_cast<size_t>(layer)];
    q.insert(q.end(), queries.begin(), queries.end());
    p.insert(p.end(), query_positions.begin(), query_positions.end());
    const size_t keep = static_cast<size_t>(policy_.query_window);
    if (p.size() > keep) {
      const size_t drop = p.size() - keep;
      p.erase(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(drop));
      q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(drop * row));
    }
  }
  if (query_positions.size() == 1 && !always_fetch_ && query_positions[0] >= base_position_ &&
      base_position_ >= 0) {
    ++attend_calls_;
    client::AttendRequest request;
    request.sequence_id = sequence_id_;
    request.layer = layer;
    request.dtype = client::DType::kF32;
    request.queries = queries.data();
    request.bytes = queries.size() * sizeof(float);
    request.positions = {query_positions[0] - base_position_};
    auto r = client_->Attend(request);
    if (!r.ok()) return r.status();
    if (r->output.size() != out.size() * sizeof(float)) {
      return absl::InternalError("Attend returned an output of the wrong size");
    }
    std::memcpy(out.data(), r->output.data(), r->output.size());
    return absl::OkStatus();
  }
  auto kv = FetchLayer(layer, /*include_unfinished=*/true);
  if (!kv.ok()) return kv.status();
  AttendLayer(geometry_, *kv, queries, query_positions, out, threads_);
  return absl::OkStatus();
}

int64_t ServiceKvCache::CompressionPoint() const {
  if (CompressesAtDocumentEnd()) {
    return prompt_tokens_ > 0 ? std::min(document_tokens_, prompt_tokens_) : document_tokens_;
  }
  return prompt_tokens_;
}

absl::Status ServiceKvCache::UseQueryStats(std::vector<QueryStats> stats) {
  const size_t mean = static_cast<size_t>(geometry_.num_q_heads) * geometry_.head_dim;
  const size_t cov = mean * static_cast<size_t>(geometry_.head_dim);
  if (stats.size() != static_cast<size_t>(geometry_.num_layers)) {
    return absl::InvalidArgumentError("query statistics must cover every layer");
  }
  for (const QueryStats& s : stats) {
    if (s.mean.size() != mean || (s.covariance.size() != cov && !s.covariance.empty()) ||
        s.covariance.empty() != stats[0].covariance.empty()) {
      return absl::InvalidArgumentError(
          "query statistics: mean [q heads, head_dim] and covariance [q heads, head_dim, "
          "head_dim] (every layer, or none) per layer");
    }
  }
  given_stats_ = std::move(stats);
  return absl::OkStatus();
}

absl::Status ServiceKvCache::CompressWithQueryStats() {
  const int32_t first = std::max(base_position_, 0);
  if (!given_stats_ && attached_tokens_ > first + policy_.sinks()) {
    // The attached tokens' queries never came through Attend.
    return absl::FailedPreconditionError(absl::StrCat(
        "Expected Attention needs statistics of the whole prompt's queries, but ", attached_tokens_,
        " tokens came from the prefix cache; give their statistics with UseQueryStats"));
  }
  const bool given = given_stats_.has_value();
  std::vector<QueryStats> stats = given ? std::move(*given_stats_) : stats_->Finish();
  if (!given && stats[0].count == 0 && CompressionPoint() > first + policy_.sinks()) {
    // Queries that never came through Attend (the `fetch` attention path).
    return absl::FailedPreconditionError("no prompt queries were seen for Expected Attention");
  }
  given_stats_.reset();
  std::vector<client::LayerQueryStats> layers;
  layers.reserve(stats.size());
  for (size_t l = 0; l < stats.size(); ++l) {
    // A prompt of sinks only has no statistics: zeros (then nothing is left to evict).
    client::LayerQueryStats q;
    q.layer = static_cast<int>(l);
    q.mean = stats[l].mean;
    q.covariance = stats[l].covariance;
    layers.push_back(std::move(q));
  }
  auto r = client_->Compress(sequence_id_, policy_.at_prompt_end, layers);
  compressed_ = true;
  sent_stats_ = std::move(stats);
  stats_.reset();
  return r.ok() ? absl::OkStatus() : r.status();
}

absl::Status ServiceKvCache::CompressAtPromptEnd() {
  if (policy_.query_agnostic()) return CompressWithQueryStats();
  std::vector<client::LayerQueries> queries;
  for (int32_t l = 0; l < geometry_.num_layers; ++l) {
    const auto& q = window_queries_[static_cast<size_t>(l)];
    const auto& p = window_positions_[static_cast<size_t>(l)];
    if (p.empty()) return absl::FailedPreconditionError("no prompt queries were seen for SnapKV");
    client::LayerQueries lq;
    lq.layer = l;
    lq.dtype = client::DType::kF32;
    lq.queries = q.data();
    lq.bytes = q.size() * sizeof(float);
    for (int32_t position : p) lq.positions.push_back(position - std::max(base_position_, 0));
    queries.push_back(lq);
  }
  client::CompressionSpec spec = policy_.at_prompt_end;
  const int window = static_cast<int>(window_positions_[0].size());
  if (spec.eviction == client::CompressionSpec::Eviction::kSnapKv) {
    // A prompt shorter than the window: score with what there is.
    spec.window = std::min(spec.window, window);
    if (spec.budget <= spec.window) spec.budget = spec.window + 1;
  }
  auto r = client_->Compress(sequence_id_, spec, queries);
  compressed_ = true;
  window_queries_.assign(window_queries_.size(), {});
  window_positions_.assign(window_positions_.size(), {});
  return r.ok() ? absl::OkStatus() : r.status();
}

absl::Status ServiceKvCache::LoadPrompt(KvCache& source, int32_t prompt_tokens,
                                        const std::vector<std::vector<float>>& window_queries,
                                        const std::vector<std::vector<int32_t>>& window_positions,
                                        int32_t chunk_tokens) {
  const size_t layers = static_cast<size_t>(geometry_.num_layers);
  const size_t heads = static_cast<size_t>(geometry_.num_kv_heads);
  const size_t d = static_cast<size_t>(geometry_.head_dim);
  const size_t row = static_cast<size_t>(geometry_.num_q_heads) * d;
  if (base_position_ >= 0) return absl::FailedPreconditionError("LoadPrompt into a used cache");
  if (policy_.query_agnostic()) {
    if (!given_stats_) {
      return absl::FailedPreconditionError(
          "LoadPrompt: Expected Attention needs the prompt's query statistics (UseQueryStats)");
    }
  } else if (policy_.compress_at_prompt_end &&
             (window_queries.size() != layers || window_positions.size() != layers)) {
    return absl::InvalidArgumentError("LoadPrompt needs observation queries for every layer");
  }
  ExpectPrompt(prompt_tokens);
  const size_t chunk = static_cast<size_t>(std::max(chunk_tokens, 1));
  for (int32_t l = 0; l < geometry_.num_layers; ++l) {
    auto kv = source.Fetch(l);
    if (!kv.ok()) return kv.status();
    const size_t n = static_cast<size_t>(prompt_tokens);
    for (const HeadKv& h : kv->heads) {
      bool dense = h.positions.size() >= n;
      for (size_t t = 0; dense && t < n; ++t) dense = h.positions[t] == static_cast<int32_t>(t);
      if (!dense) {
        return absl::FailedPreconditionError(
            "LoadPrompt: the source must hold every position of the prompt in every kv head");
      }
    }
    for (size_t start = 0; start < n; start += chunk) {
      const size_t len = std::min(chunk, n - start);
      std::vector<int32_t> positions(len);
      std::iota(positions.begin(), positions.end(), static_cast<int32_t>(start));
      std::vector<float> k(len * heads * d), v(len * heads * d);
      for (size_t t = 0; t < len; ++t) {
        for (size_t h = 0; h < heads; ++h) {
          const HeadKv& src = kv->heads[h];
          std::memcpy(&k[(t * heads + h) * d], &src.keys[(start + t) * d], d * sizeof(float));
          std::memcpy(&v[(t * heads + h) * d], &src.values[(start + t) * d], d * sizeof(float));
        }
      }
      if (auto s = Append(l, positions, k, v); !s.ok()) return s;
    }
    if (policy_.compress_at_prompt_end && !policy_.query_agnostic()) {
      // What Attend would have kept from the prefill: the newest query_window queries.
      const auto& q = window_queries[static_cast<size_t>(l)];
      const auto& p = window_positions[static_cast<size_t>(l)];
      if (q.size() != p.size() * row) {
        return absl::InvalidArgumentError("LoadPrompt: queries and positions disagree");
      }
      const size_t keep = std::min(p.size(), static_cast<size_t>(policy_.query_window));
      const size_t drop = p.size() - keep;
      window_queries_[static_cast<size_t>(l)].assign(
          q.begin() + static_cast<std::ptrdiff_t>(drop * row), q.end());
      window_positions_[static_cast<size_t>(l)].assign(
          p.begin() + static_cast<std::ptrdiff_t>(drop), p.end());
    }
  }
  return CommitStep(prompt_tokens);
}

absl::Status ServiceKvCache::CommitStep(int32_t end_position) {
  // The prompt's end, or the document's for a query-agnostic policy.
  const int64_t point = CompressionPoint();
  if (publish_ && point > 0 && end_position >= point) {
    auto published = client_->PublishPrefix(sequence_id_, *publish_);
    publish_.reset();
    if (!published.ok()) return published.status();
    published_ = *published;
  }
  if (policy_.compress_at_prompt_end && !compressed_ && point > 0 && end_position >= point) {
    if (absl::Status s = CompressAtPromptEnd(); !s.ok()) return s;
    if (keep_document_ && CompressesAtDocumentEnd()) {
      auto kept = client_->ForkSequence(sequence_id_);
      if (!kept.ok()) return kept.status();
      kept_document_ = kept->sequence_id;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<client::SequenceInfo> ServiceKvCache::Info() const {
  return client_->GetSequence(sequence_id_);
}

int64_t ServiceKvCache::StoredTokenSlots() const {
  auto info = client_->GetSequence(sequence_id_);
  return info.ok() ? info->stored_token_heads : -1;
}

std::string ServiceKvCache::Describe() const {
  return absl::StrCat("kvcached sequence ", sequence_id_, always_fetch_ ? " (fetch path)" : "");
}

}  // namespace kvc::worker
