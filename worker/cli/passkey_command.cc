// kvc-worker passkey: passkey retrieval grid (lengths x depths x policies), with the policies'
// caches held locally (--kv=local: full, window=W, streaming=S+W) or in kvcached
// (--kv=kvcached: POLICY[:STORAGE] with the service policies of `generate`, e.g. full:fp8,
// snapkv=1024:int4, expattn=256:int4, h2o=256+256, streaming=4+508; the query-agnostic
// expattn compresses the context before the question is prefilled). Progress goes to stderr, a
// markdown table to stdout, every number to --json.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/json_string.h"
#include "worker/cli/commands.h"
#include "worker/eval/passkey.h"
#ifdef KVC_WORKER_WITH_SERVICE
#include "kvc/client/admin_client.h"
#include "kvc/client/kv_cache_client.h"
#include "worker/service/service_kv_cache.h"
#include "worker/service/service_policy_parse.h"
#endif

namespace kvc::worker {
namespace {

#ifdef KVC_WORKER_WITH_SERVICE
// A kvcached policy "POLICY[:STORAGE]": a service sequence per case, loaded with the prefilled
// K/V and compressed at the end of the prompt as `generate --kv=kvcached` does.
absl::StatusOr<PasskeyPolicy> ServicePasskeyPolicy(const std::string& name,
                                                   client::KvCacheClient* client,
                                                   const std::string& pool, LlamaModel* model) {
  const std::vector<std::string> parts = absl::StrSplit(name, absl::MaxSplits(':', 1));
  auto policy =
      ParseServicePolicy(parts[0] == "full" ? "" : parts[0], parts.size() > 1 ? parts[1] : "");
  if (!policy.ok()) return policy.status();
  PasskeyPolicy p;
  p.name = name;
  p.observation_queries = policy->query_window;
  p.query_agnostic = policy->query_agnostic();
  if (p.query_agnostic && policy->sinks() != kExpectedAttentionSinks) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": the harness's query statistics leave out ", kExpectedAttentionSinks, " sinks"));
  }
  const ServicePolicy sp = *policy;
  p.load = [=](const PrefilledPrompt& prompt) -> absl::StatusOr<std::unique_ptr<KvCache>> {
    auto store = ServiceKvCache::Create(client, pool, model->config().kv_geometry(), sp,
                                        /*always_fetch=*/false, model->pool());
    if (!store.ok()) return store.status();
    // Expected Attention: the context alone, with its queries' statistics.
    if (sp.query_agnostic()) {
      if (auto s = (*store)->UseQueryStats(prompt.query_stats); !s.ok()) return s;
    }
    if (auto s = (*store)->LoadPrompt(
            *prompt.kv, sp.query_agnostic() ? prompt.context_tokens : prompt.prompt_tokens,
            prompt.window_queries, prompt.window_positions);
        !s.ok()) {
      return s;
    }
    return std::unique_ptr<KvCache>(std::move(*store));
  };
  p.footprint = [](KvCache& kv, const PrefilledPrompt&) -> absl::StatusOr<KvFootprint> {
    auto info = static_cast<ServiceKvCache&>(kv).Info();
    if (!info.ok()) return info.status();
    const KvGeometry& g = kv.geometry();
    KvFootprint f;
    f.token_slots = info->stored_token_heads;
    f.bytes = info->bytes;
    f.dense_f16_bytes =
        info->visible_tokens * g.num_layers * g.num_kv_heads * int64_t{2} * 2 * g.head_dim;
    return f;
  };
  return p;
}
#endif

// --cases-out: the grid as JSON lines, {"length", "depth", "key_index", "passkey", "context",
// "question", "answer"} (token ids), for another engine to run the same cases
// (scripts/eval/kvpress_side_by_side.py); nothing is prefilled.
absl::Status WriteCases(const LlamaModel& model, const std::string& haystack,
                        const PasskeyOptions& opt, const std::string& path) {
  std::ofstream out(path);
  for (const PasskeyCase& c : MakePasskeyCases(model.tokenizer(), haystack, opt)) {
    out << absl::StrFormat(
        "{\"length\": %d, \"depth\": %g, \"key_index\": %d, \"passkey\": \"%s\", "
        "\"context\": [%s], \"question\": [%s], \"answer\": [%s]}\n",
        c.length, c.depth, c.key_index, c.passkey, absl::StrJoin(c.context, ", "),
        absl::StrJoin(c.question, ", "), absl::StrJoin(c.answer, ", "));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write --cases-out file ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunPasskey(int argc, char** argv) {
  auto flags = Flags::Parse(
      argc, argv, 2,
      {"model",      "threads",       "haystack-file", "lengths",  "depths",
       "policies",   "chunk",         "seed",          "json",     "chat",
       "kv",         "target",        "pool",          "keys",     "question-in-prompt",
       "label",      "tls-ca",        "tls-cert",      "tls-key",  "tls-server-name",
       "token-file", "answer-tokens", "key-tokens",    "cases-out"},
      {"chat", "question-in-prompt", "key-tokens"});
  if (!flags.ok()) return flags.status();
  const std::string haystack_path =
      flags->Get("haystack-file", KVC_REPO_ROOT "/.cache/corpus/emma.txt");
  auto haystack = ReadFile(haystack_path);
  if (!haystack.ok()) return haystack.status();
  auto lengths = ParseList<int64_t>(flags->Get("lengths", "1024,2048,4096"));
  auto depths = ParseList<double>(flags->Get("depths", "0,0.25,0.5,0.75,1"));
  auto chunk = flags->GetInt("chunk", 256);
  auto seed = flags->GetInt("seed", 1234);
  auto keys = flags->GetInt("keys", 1);
  // Greedy tokens generated per answer; the pass key must appear among them. The model often
  // restates the question first, so 32 scores what a reader would (issue 19); 8 by default.
  auto answer_tokens = flags->GetInt("answer-tokens", 8);
  for (const absl::Status& s : {lengths.status(), depths.status(), chunk.status(), seed.status(),
                                keys.status(), answer_tokens.status()}) {
    if (!s.ok()) return s;
  }
  const std::string where = flags->Get("kv", "local");
  if (where != "local" && where != "kvcached") {
    return absl::InvalidArgumentError("--kv is local or kvcached");
  }
  auto model = LoadModel(*flags);
  if (!model.ok()) return model.status();
  const std::vector<std::string> names =
      absl::StrSplit(flags->Get("policies", where == "local" ? "full,window=512,streaming=4+508"
                                                             : "full,snapkv=256,snapkv=256:int4"),
                     ',');
  std::vector<PasskeyPolicy> policies;
#ifdef KVC_WORKER_WITH_SERVICE
  std::unique_ptr<client::KvCacheClient> client;
  client::PoolStats before;
#endif
  if (where == "kvcached") {
#ifdef KVC_WORKER_WITH_SERVICE
    auto connected = ConnectToKvcached(*flags);
    if (!connected.ok()) return connected.status();
    client = std::move(*connected);
    for (const std::string& name : names) {
      auto p = ServicePasskeyPolicy(name, client.get(), flags->Get("pool", ""), model->get());
      if (!p.ok()) return p.status();
      policies.push_back(std::move(*p));
    }
    auto stats = kvc::client::AdminClient::Over(*client).GetPoolStats(flags->Get("pool", ""));
    if (!stats.ok()) {
      return absl::Status(
          stats.status().code(),
          absl::StrCat("kvcached at ", KvcachedTarget(*flags), ": ", stats.status().message()));
    }
    before = *stats;
#else
    return absl::InvalidArgumentError("--kv=kvcached needs the full build");
#endif
  } else {
    for (const std::string& name : names) {
      if (auto p = ParsePolicy(name); !p.ok()) return p.status();
      policies.push_back(LocalPasskeyPolicy({name, [name] { return *ParsePolicy(name); }}));
    }
  }

  PasskeyOptions opt;
  opt.lengths = *lengths;
  opt.depths = *depths;
  opt.keys_per_cell = static_cast<int>(*keys);
  if (*answer_tokens < 1) return absl::InvalidArgumentError("--answer-tokens must be >= 1");
  opt.answer_max_tokens = static_cast<int32_t>(*answer_tokens);
  opt.prefill_chunk = static_cast<int32_t>(*chunk);
  opt.seed = static_cast<uint64_t>(*seed);
  opt.chat = flags->Has("chat");
  opt.count_key_tokens = flags->Has("key-tokens");
  // kvcached: the engine's way (generate --kv=kvcached): the question is part of the prompt
  // (query-agnostic policies compress the context alone).
  opt.question_in_prompt = where == "kvcached" || flags->Has("question-in-prompt");
  if (flags->Has("cases-out"))
    return WriteCases(**model, *haystack, opt, flags->Get("cases-out", ""));
  const std::string label = flags->Get("label", "");
  opt.on_progress = [&](const std::string& line) {
    std::cerr << "[passkey] " << label << (label.empty() ? "" : " ") << line << "\n";
  };
  opt.on_score = [](const PasskeyScore& s) {
    std::cerr << absl::StrFormat(
        "[passkey] %-18s len %5d depth %.2f  logp %7.3f  tf %d  gen %d  key %s  %6.1fx  %.1f+%.1f "
        "s  %s\n",
        s.policy, s.context_tokens, s.depth, s.answer_logprob, s.teacher_forced_match,
        s.generated_match,
        s.key_slots > 0 ? absl::StrFormat("%3.0f%%", 100.0 * s.key_slots_kept / s.key_slots)
                        : std::string("  -"),
        static_cast<double>(s.kv.dense_f16_bytes) / std::max<double>(1.0, s.kv.bytes),
        s.load_seconds, s.answer_seconds,
        absl::CEscape(s.generated));  // one line per score even when the answer has newlines
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto scores = RunPasskey(**model, *haystack, policies, opt);
  if (!scores.ok()) return scores.status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Markdown: per policy and length, accuracy (teacher-forced / generated) and the mean answer
  // log-probability; then the KV held against a dense f16 cache.
  std::cout << "| policy |";
  for (int64_t len : *lengths) std::cout << " " << len << " tok: tf / gen / mean log p |";
  std::cout << " all: tf / gen / mean log p | KV vs f16 |\n| --- |";
  for (size_t i = 0; i <= lengths->size() + 1; ++i) std::cout << " --- |";
  std::cout << "\n";
  for (const PasskeyPolicy& policy : policies) {
    std::cout << "| " << policy.name << " |";
    double ratio = 0;
    int all_n = 0, all_tf = 0, all_gen = 0;
    double all_logp = 0;
    for (size_t li = 0; li <= lengths->size(); ++li) {
      int n = 0, tf = 0, gen = 0;
      double logp = 0;
      const size_t per_length = depths->size() * static_cast<size_t>(std::max<int64_t>(*keys, 1));
      for (size_t i = 0; i < scores->size(); ++i) {
        const PasskeyScore& s = (*scores)[i];
        const size_t case_index = i / policies.size();
        if (s.policy != policy.name) continue;
        if (li < lengths->size() && case_index / per_length != li) continue;
        ++n;
        tf += s.teacher_forced_match;
        gen += s.generated_match;
        logp += s.answer_logprob;
        if (li == lengths->size()) {
          ratio += static_cast<double>(s.kv.dense_f16_bytes) / std::max<double>(1.0, s.kv.bytes);
        }
      }
      if (li == lengths->size()) {
        all_n = n, all_tf = tf, all_gen = gen, all_logp = logp;
      } else {
        std::cout << absl::StrFormat(" %d/%d / %d/%d / %.2f |", tf, n, gen, n,
                                     logp / std::max(n, 1));
      }
    }
    std::cout << absl::StrFormat(" %d/%d / %d/%d / %.2f | %.1fx smaller |\n", all_tf, all_n,
                                 all_gen, all_n, all_logp / std::max(all_n, 1),
                                 ratio / std::max(all_n, 1));
  }

  std::string json = absl::StrFormat(
      "{\"kv\": \"%s\", \"haystack\": %s, \"label\": %s, \"chat\": %s, \"question_in_prompt\": "
      "%s, \"seed\": %d, \"seconds\": %.1f, \"scores\": [",
      where, ::kvc::JsonString(haystack_path), ::kvc::JsonString(label),
      opt.chat ? "true" : "false", opt.question_in_prompt ? "true" : "false", *seed, seconds);
  for (size_t i = 0; i < scores->size(); ++i) {
    const PasskeyScore& s = (*scores)[i];
    std::string lps;
    for (size_t t = 0; t < s.token_logprob.size(); ++t) {
      absl::StrAppend(&lps, t ? ", " : "", absl::StrFormat("%.4f", s.token_logprob[t]));
    }
    absl::StrAppend(
        &json, i ? ",\n  " : "\n  ",
        absl::StrFormat(
            "{\"policy\": \"%s\", \"context_tokens\": %d, \"prompt_tokens\": %d, \"depth\": %.3f, "
            "\"key_index\": %d, \"passkey\": \"%s\", \"answer_logprob\": %.5f, "
            "\"token_logprob\": [%s], \"teacher_forced_match\": %s, \"generated_match\": %s, "
            "\"generated\": %s, \"kv_slots\": %d, \"kv_bytes\": %d, \"dense_f16_bytes\": %d, "
            "\"load_seconds\": %.3f, \"answer_seconds\": %.3f, \"key_slots\": %d, "
            "\"key_slots_kept\": %d, \"key_kept_by_layer\": [%s]}",
            s.policy, s.context_tokens, s.prompt_tokens, s.depth, s.key_index, s.passkey,
            s.answer_logprob, lps, s.teacher_forced_match ? "true" : "false",
            s.generated_match ? "true" : "false", ::kvc::JsonString(s.generated), s.kv.token_slots,
            s.kv.bytes, s.kv.dense_f16_bytes, s.load_seconds, s.answer_seconds, s.key_slots,
            s.key_slots_kept, absl::StrJoin(s.key_kept_by_layer, ", ")));
  }
  json += "\n]";
#ifdef KVC_WORKER_WITH_SERVICE
  if (client != nullptr) {
    // Every sequence this run made is released: the pool is back where it started.
    auto after = kvc::client::AdminClient::Over(*client).GetPoolStats(flags->Get("pool", ""));
    if (!after.ok()) return after.status();
    absl::StrAppend(
        &json,
        absl::StrFormat(", \"pool_before\": {\"sequences\": %d, \"used_bytes\": %d}, "
                        "\"pool_after\": {\"sequences\": %d, \"used_bytes\": %d}",
                        before.sequences, before.used_bytes, after->sequences, after->used_bytes));
    std::cerr << absl::StrFormat(
        "[passkey] %.0f s; kvcached pool: %d sequences / %d bytes before, %d / %d after\n", seconds,
        before.sequences, before.used_bytes, after->sequences, after->used_bytes);
    if (after->sequences != before.sequences || after->used_bytes != before.used_bytes) {
      std::cerr << "[passkey] WARNING: the pool did not return to its starting state\n";
    }
  }
#endif
  json += "}\n";
  if (flags->Has("json")) {
    std::ofstream out(flags->Get("json", ""));
    out << json;
    if (!out) return absl::InternalError("cannot write --json file");
  }
  return absl::OkStatus();
}

}  // namespace kvc::worker
