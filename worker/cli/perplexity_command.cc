// kvc-worker perplexity: perplexity of a text file under several policies, with the KV cache
// in a local cache or in kvcached (--kv=kvcached).
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "worker/cli/commands.h"
#include "worker/engine/local_kv_cache.h"
#include "worker/eval/perplexity.h"
#ifdef KVC_WORKER_WITH_SERVICE
#include "kvc/client/kv_cache_client.h"
#include "worker/service/service_kv_cache.h"
#include "worker/service/service_policy_parse.h"
#endif

namespace kvc::worker {

absl::Status RunPerplexity(int argc, char** argv) {
  auto flags =
      Flags::Parse(argc, argv, 2,
                   {"model", "threads", "text-file", "max-tokens", "skip-tokens", "policies",
                    "chunk", "segment", "json", "kv", "target", "pool", "storage", "tls-ca",
                    "tls-cert", "tls-key", "tls-server-name", "token-file"},
                   {});
  if (!flags.ok()) return flags.status();
  auto text = ReadFile(flags->Get("text-file", ""));
  if (!text.ok()) return text.status();
  auto model = LoadModel(*flags);
  if (!model.ok()) return model.status();
  auto max_tokens = flags->GetInt("max-tokens", 4096);
  auto skip = flags->GetInt("skip-tokens", 0);
  auto chunk = flags->GetInt("chunk", 128);
  auto segment = flags->GetInt("segment", 512);
  for (const absl::Status& s :
       {max_tokens.status(), skip.status(), chunk.status(), segment.status()}) {
    if (!s.ok()) return s;
  }
  std::vector<int32_t> ids = (*model)->tokenizer().Encode(*text, /*parse_special=*/false);
  const int64_t begin = std::min<int64_t>(*skip, static_cast<int64_t>(ids.size()));
  const int64_t end = std::min<int64_t>(begin + *max_tokens, static_cast<int64_t>(ids.size()));
  ids = std::vector<int32_t>(ids.begin() + begin, ids.begin() + end);
  std::cerr << absl::StrFormat("[perplexity] %d tokens (from token %d), chunk %d\n", ids.size(),
                               begin, *chunk);

  std::string json = "{\"tokens\": " + std::to_string(ids.size()) + ", \"results\": [";
  const std::vector<std::string> specs =
      absl::StrSplit(flags->Get("policies", "full,window=1024,streaming=4+1020"), ',');
  const std::string where = flags->Get("kv", "local");
  const std::string storage = flags->Get("storage", "");
#ifdef KVC_WORKER_WITH_SERVICE
  std::unique_ptr<client::KvCacheClient> client;
  if (where == "kvcached") {
    auto connected = ConnectToKvcached(*flags);
    if (!connected.ok()) return connected.status();
    client = std::move(*connected);
  }
#endif
  if (where != "local" && where != "kvcached") {
    return absl::InvalidArgumentError("--kv is local or kvcached");
  }
  // Builds the cache for one policy spec (and checks every spec before minutes of work).
  auto make_store = [&](const std::string& spec) -> absl::StatusOr<std::unique_ptr<KvCache>> {
    if (where == "kvcached") {
#ifdef KVC_WORKER_WITH_SERVICE
      auto policy = ParseServicePolicy(spec == "full" ? "" : spec, storage);
      if (!policy.ok()) return policy.status();
      if (client == nullptr) return absl::InvalidArgumentError("no kvcached client");
      auto store = ServiceKvCache::Create(client.get(), flags->Get("pool", ""),
                                          (*model)->config().kv_geometry(), *policy,
                                          /*always_fetch=*/false, (*model)->pool());
      if (!store.ok()) return store.status();
      return std::unique_ptr<KvCache>(std::move(*store));
#else
      return absl::InvalidArgumentError("--kv=kvcached needs the full build");
#endif
    }
    if (!storage.empty()) return absl::InvalidArgumentError("--storage needs --kv=kvcached");
    auto policy = ParsePolicy(spec);
    if (!policy.ok()) return policy.status();
    return std::unique_ptr<KvCache>(std::make_unique<LocalKvCache>(
        (*model)->config().kv_geometry(), std::move(*policy), (*model)->pool()));
  };
  for (const std::string& spec : specs) {
    auto store = make_store(spec);  // a kvcached sequence is released again at once
    if (!store.ok()) return store.status();
  }
  for (size_t p = 0; p < specs.size(); ++p) {
    auto store = make_store(specs[p]);
    if (!store.ok()) return store.status();
    KvCache& kv = **store;
    PerplexityOptions opt;
    opt.chunk = static_cast<int32_t>(*chunk);
    opt.segment = static_cast<int32_t>(*segment);
    opt.progress = [&](int64_t scored, double ppl) {
      std::cerr << absl::StrFormat("\r[perplexity] %-24s %6d/%d  ppl %.3f", kv.Describe(), scored,
                                   ids.size() - 1, ppl);
    };
    auto r = EvaluatePerplexity(**model, kv, ids, opt);
    if (!r.ok()) return r.status();
    std::cerr << "\n";
    std::cout << absl::StrFormat(
        "%-28s ppl %9.3f  tokens %6d  peak KV slots %8d  %.1f s (%.1f tok/s)\n", kv.Describe(),
        r->perplexity, r->tokens_scored, r->max_stored_slots, r->seconds,
        r->tokens_scored / r->seconds);
    std::string curve;
    for (size_t i = 0; i < r->segment_perplexity.size(); ++i) {
      absl::StrAppend(&curve, i ? ", " : "", absl::StrFormat("%.4f", r->segment_perplexity[i]));
    }
    absl::StrAppend(&json, p ? ", " : "",
                    absl::StrFormat("{\"policy\": \"%s\", \"store\": \"%s\", \"perplexity\": %.6f, "
                                    "\"tokens_scored\": %d, \"peak_kv_slots\": %d, \"seconds\": "
                                    "%.2f, \"segment\": %d, \"segment_perplexity\": [%s]}",
                                    specs[p], kv.Describe(), r->perplexity, r->tokens_scored,
                                    r->max_stored_slots, r->seconds, *segment, curve));
  }
  json += "]}\n";
  if (flags->Has("json")) {
    std::ofstream out(flags->Get("json", ""));
    out << json;
    if (!out) return absl::InternalError("cannot write --json file");
  }
  return absl::OkStatus();
}

}  // namespace kvc::worker
