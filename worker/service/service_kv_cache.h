// ServiceKvCache: the worker engine's KvCache backed by kvcached through the client library —
// the KV cache lives in the service, not in the engine.
//
//   Append   -> client Append (f32; the service stores it in the sequence's format)
//   Attend   -> decode (one query at or after every stored position): the service's Attend,
//               computed next to the memory in the stored format;
//               prefill chunks (causal inside the chunk): Fetch of the layer (with the
//               chunk's own tokens) + local attention. The `fetch` path uses Fetch always.
//   Compress -> at the end of the prompt (ExpectPrompt), SnapKV with the last `window`
//               queries of every layer that this cache saw during prefill, or H2O ranked
//               by the same window; StreamingLLM/H2O then run automatically in the service.
//               Expected Attention (query-agnostic) with the mean and covariance of every
//               layer's prompt queries before RoPE (query_stats.h), accumulated as they pass;
//               when the prompt is a document + a question (ExpectDocument), at the end of
//               the document, from the document's queries alone.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvc/client/kv_cache_client.h"
#include "kvc/kernels/thread_pool.h"
#include "worker/engine/kv_cache.h"
#include "worker/engine/query_stats.h"

namespace kvc::worker {

struct ServicePolicy {
  // Applied automatically by the service on every append.
  client::CompressionSpec automatic;
  // Applied once by Compress when the prompt is complete (SnapKV; H2O prefill scoring;
  // Expected Attention, at the document's end when there is one).
  client::CompressionSpec at_prompt_end;
  bool compress_at_prompt_end = false;
  int32_t query_window = 32;  // prompt queries kept per layer for at_prompt_end

  // Expected Attention: ranks from statistics of the context's queries, not from the newest
  // ones, so a document compressed before its question serves any question.
  bool query_agnostic() const {
    return compress_at_prompt_end &&
           at_prompt_end.eviction == client::CompressionSpec::Eviction::kExpectedAttention;
  }
  // The first positions Expected Attention keeps and leaves out of the statistics.
  int32_t sinks() const {
    return at_prompt_end.sinks >= 0 ? at_prompt_end.sinks : kExpectedAttentionSinks;
  }
};

class ServiceKvCache : public KvCache {
 public:
  // Creates a sequence in `pool` (empty = the server's default). The pool's geometry must
  // match `geometry`. `pool_threads` (not owned, may be null) runs local attention.
  // With `prefix`, the sequence starts from the longest cached run of its token ids
  // (attached_tokens(); the engine prefills from there).
  static absl::StatusOr<std::unique_ptr<ServiceKvCache>> Create(
      client::KvCacheClient* client, const std::string& pool, const KvGeometry& geometry,
      const ServicePolicy& policy, bool always_fetch, kernels::ThreadPool* pool_threads,
      const client::Prefix* prefix = nullptr);
  // Starts from a fork of `source`, a live sequence of the same pool and policy that already
  // went through its compression (e.g. a document kept by KeepDocument): the fork holds what
  // `source` stores now, whole blocks shared copy-on-write, and nothing compresses again. The
  // engine prefills from forked_tokens() on (the source's visible tokens, at positions 0..).
  static absl::StatusOr<std::unique_ptr<ServiceKvCache>> Fork(
      client::KvCacheClient* client, const std::string& source, const KvGeometry& geometry,
      const ServicePolicy& policy, bool always_fetch, kernels::ThreadPool* pool_threads);
  ServiceKvCache(const ServiceKvCache&) = delete;
  ServiceKvCache& operator=(const ServiceKvCache&) = delete;
  ~ServiceKvCache() override;  // releases the sequence

  const KvGeometry& geometry() const override { return geometry_; }
  absl::Status Append(int32_t layer, absl::Span<const int32_t> positions,
                      absl::Span<const float> keys, absl::Span<const float> values) override;
  absl::Status Attend(int32_t layer, absl::Span<const float> queries,
                      absl::Span<const int32_t> query_positions, absl::Span<float> out) override;
  absl::StatusOr<LayerKv> Fetch(int32_t layer) override;
  absl::Status CommitStep(int32_t end_position) override;
  int64_t StoredTokenSlots() const override;
  std::string Describe() const override;

  // The prompt is `tokens` long: when CommitStep reaches it, run policy.at_prompt_end.
  void ExpectPrompt(int64_t tokens) { prompt_tokens_ = tokens; }
  // The prompt's first `tokens` are a document and the rest a question about it. A
  // query-agnostic policy (Expected Attention) then compresses when CommitStep reaches the
  // document's end, from the statistics of the document's queries only, so the compressed
  // document is the same whatever the question (which is prefilled over it); the engine
  // should end a prefill chunk there (GenerateOptions::prefill_split). Other policies still
  // run at the prompt's end. 0 = no document.
  void ExpectDocument(int64_t tokens) { document_tokens_ = tokens; }
  // Whether the policy runs at ExpectDocument's end (query-agnostic, with a document).
  bool CompressesAtDocumentEnd() const { return policy_.query_agnostic() && document_tokens_ > 0; }
  // When CommitStep reaches the prompt's end (the document's, when the policy compresses
  // there), first publish the whole blocks stored so far under `prefix` (its token ids are the
  // prompt's), before any compression changes them.
  void PublishAtPromptEnd(client::Prefix prefix) { publish_ = std::move(prefix); }
  // Right after the compression at the document's end (CompressesAtDocumentEnd), fork the
  // compressed document into a sequence of its own, before the question is prefilled: later
  // requests Fork it instead of prefilling and compressing the document again. The caller
  // owns (and releases) kept_document(), empty until then.
  void KeepDocument() { keep_document_ = true; }
  const std::string& kept_document() const { return kept_document_; }
  // Tokens the sequence started with from Fork (0 otherwise).
  int64_t forked_tokens() const { return forked_tokens_; }
  // Expected Attention: compress with these statistics ([num_layers]) instead of the ones this
  // cache accumulates, e.g. a document's from an earlier request when this sequence attached
  // the document's blocks from the prefix cache (their queries never pass through here).
  absl::Status UseQueryStats(std::vector<QueryStats> stats);
  // The statistics Expected Attention's compression sent (empty before it ran).
  const std::vector<QueryStats>& query_stats() const { return sent_stats_; }
  // Tokens the sequence started with from the prefix cache.
  int64_t attached_tokens() const { return attached_tokens_; }
  // What the publish at the prompt's end reported (zeros before it ran).
  const client::PublishResult& published() const { return published_; }

  // Loads a prompt prefilled elsewhere into this (empty) cache and ends the prompt as
  // `kvc-worker generate` would after prefilling it here: Append of every layer's K/V in
  // position order (chunks of `chunk_tokens`), then CommitStep(prompt_tokens), which runs
  // policy.at_prompt_end with `window_queries` as the observation window (per layer
  // [n, num_q_heads, head_dim] rotated at `window_positions`; the newest
  // policy.query_window are used). Expected Attention takes UseQueryStats's statistics
  // instead (call it first; the window queries may then be empty). `source` must hold the
  // full cache of positions [0, prompt_tokens) (every kv head the same tokens; later
  // positions are left out).
  absl::Status LoadPrompt(KvCache& source, int32_t prompt_tokens,
                          const std::vector<std::vector<float>>& window_queries,
                          const std::vector<std::vector<int32_t>>& window_positions,
                          int32_t chunk_tokens = 2048);
  const std::string& sequence_id() const { return sequence_id_; }
  // Bytes the service holds for this sequence, and what a dense f16 cache would take.
  absl::StatusOr<client::SequenceInfo> Info() const;
  int64_t attend_calls() const { return attend_calls_; }
  int64_t fetch_calls() const { return fetch_calls_; }

 private:
  ServiceKvCache(client::KvCacheClient* client, const KvGeometry& geometry,
                 const ServicePolicy& policy, bool always_fetch, kernels::ThreadPool* pool_threads)
      : client_(client),
        geometry_(geometry),
        policy_(policy),
        always_fetch_(always_fetch),
        threads_(pool_threads),
        window_queries_(static_cast<size_t>(geometry.num_layers)),
        window_positions_(static_cast<size_t>(geometry.num_layers)) {
    if (policy_.query_agnostic()) stats_.emplace(geometry);
  }

  absl::StatusOr<LayerKv> FetchLayer(int32_t layer, bool include_unfinished);
  // Where policy.at_prompt_end runs: the document's end or the prompt's; <= 0 = not known.
  int64_t CompressionPoint() const;
  absl::Status CompressAtPromptEnd();
  absl::Status CompressWithQueryStats();

  client::KvCacheClient* client_;
  KvGeometry geometry_;
  ServicePolicy policy_;
  bool always_fetch_;
  kernels::ThreadPool* threads_;
  std::string sequence_id_;
  int64_t prompt_tokens_ = -1;
  int64_t document_tokens_ = 0;
  bool compressed_ = false;
  // Expected Attention: the statistics of the prompt's (document's) queries so far, or the
  // ones given by UseQueryStats; what was sent.
  std::optional<QueryStatsAccumulator> stats_;
  std::optional<std::vector<QueryStats>> given_stats_;
  std::vector<QueryStats> sent_stats_;
  // The latest prompt queries per layer, [<= window, num_q_heads, head_dim], for SnapKV.
  std::vector<std::vector<float>> window_queries_;
  std::vector<std::vector<int32_t>> window_positions_;
  // kvcached numbers each layer's tokens from 0; the engine may start anywhere. The first
  // appended position becomes the service's 0 (all layers must start there).
  int32_t base_position_ = -1;
  int64_t attend_calls_ = 0;
  int64_t fetch_calls_ = 0;
  int64_t attached_tokens_ = 0;
  int64_t forked_tokens_ = 0;
  bool keep_document_ = false;
  std::string kept_document_;
  std::optional<client::Prefix> publish_;
  client::PublishResult published_;
};

}  // namespace kvc::worker
