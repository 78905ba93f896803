// kvc-worker generate: answer a prompt (or a document + question) with the KV cache in
// kvcached (--kv=kvcached) or in a local cache, and report tokens/s and the KV held against a
// full f16 cache. With --prompt-file and --question, a query-agnostic kvcached policy
// (--policy expattn=...) compresses the document before the question is prefilled.
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
#include "worker/engine/chat_template.h"
#include "worker/engine/generator.h"
#include "worker/engine/local_kv_cache.h"
#ifdef KVC_WORKER_WITH_SERVICE
#include "kvc/client/kv_cache_client.h"
#include "worker/service/service_kv_cache.h"
#include "worker/service/service_policy_parse.h"
#endif

namespace kvc::worker {

absl::Status RunGenerate(int argc, char** argv) {
  auto flags = Flags::Parse(
      argc, argv, 2,
      {"model",          "threads",     "prompt",  "prompt-file",     "question",  "raw",
       "max-new-tokens", "temperature", "top-k",   "top-p",           "seed",      "policy",
       "attention",      "chunk",       "kv",      "target",          "pool",      "storage",
       "tls-ca",         "tls-cert",    "tls-key", "tls-server-name", "token-file"},
      {"raw"});
  if (!flags.ok()) return flags.status();
  std::string prompt = flags->Get("prompt", "");
  std::string document;  // the prompt's leading document when a question follows it
  if (flags->Has("prompt-file")) {
    auto text = ReadFile(flags->Get("prompt-file", ""));
    if (!text.ok()) return text.status();
    prompt = *text;
    if (flags->Has("question")) {
      document = prompt;
      prompt += "\n\n" + flags->Get("question", "");
    }
  }
  if (prompt.empty()) return absl::InvalidArgumentError("give --prompt or --prompt-file");
  auto model = LoadModel(*flags);
  if (!model.ok()) return model.status();
  const BpeTokenizer& tok = (*model)->tokenizer();
  const bool raw = flags->Has("raw");
  const std::string text =
      raw ? prompt : ApplyChatTemplate({{"user", prompt}}, /*add_generation_prompt=*/true);
  const std::vector<int32_t> ids = tok.Encode(text, /*parse_special=*/!raw);

  const std::string where = flags->Get("kv", "local");
  // Where the document ends in `ids` (kvcached's query-agnostic policies compress there).
  [[maybe_unused]] const int64_t document_tokens =
      document.empty() || where != "kvcached"
          ? 0
          : DocumentTokens(tok.Encode(raw ? document : ChatDocumentPrefix(document), !raw), ids);
#ifdef KVC_WORKER_WITH_SERVICE
  // Declared before the cache: the cache releases its sequence through the client.
  std::unique_ptr<client::KvCacheClient> client;
  ServiceKvCache* service = nullptr;
#endif
  std::unique_ptr<KvCache> store;
#ifdef KVC_WORKER_WITH_SERVICE
  if (where == "kvcached") {
    auto service_policy =
        ParseServicePolicy(flags->Get("policy", "full"), flags->Get("storage", ""));
    if (!service_policy.ok()) return service_policy.status();
    auto connected = ConnectToKvcached(*flags);
    if (!connected.ok()) return connected.status();
    client = std::move(*connected);
    auto created = ServiceKvCache::Create(
        client.get(), flags->Get("pool", ""), (*model)->config().kv_geometry(), *service_policy,
        flags->Get("attention", "store") == "fetch", (*model)->pool());
    if (!created.ok()) {
      return absl::Status(
          created.status().code(),
          absl::StrCat("kvcached at ", KvcachedTarget(*flags), ": ", created.status().message()));
    }
    (*created)->ExpectPrompt(static_cast<int64_t>(ids.size()));
    (*created)->ExpectDocument(document_tokens);
    service = created->get();
    store = std::move(*created);
  }
#endif
  if (store == nullptr) {
    if (where != "local") {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv is local or kvcached (kvcached needs the full build with the client "
                       "library); got '",
                       where, "'"));
    }
    if (flags->Has("storage")) return absl::InvalidArgumentError("--storage needs --kv=kvcached");
    auto policy = ParsePolicy(flags->Get("policy", "full"));
    if (!policy.ok()) return policy.status();
    store = std::make_unique<LocalKvCache>((*model)->config().kv_geometry(), std::move(*policy),
                                           (*model)->pool());
  }
  KvCache& kv = *store;

  GenerateOptions opt;
  auto max_new = flags->GetInt("max-new-tokens", 128);
  auto temp = flags->GetDouble("temperature", 0.0);
  auto top_k = flags->GetInt("top-k", 40);
  auto top_p = flags->GetDouble("top-p", 0.95);
  auto seed = flags->GetInt("seed", 42);
  auto chunk = flags->GetInt("chunk", 256);
  for (const absl::Status& s : {max_new.status(), temp.status(), top_k.status(), top_p.status(),
                                seed.status(), chunk.status()}) {
    if (!s.ok()) return s;
  }
  opt.max_new_tokens = static_cast<int32_t>(*max_new);
  opt.prefill_chunk = static_cast<int32_t>(*chunk);
#ifdef KVC_WORKER_WITH_SERVICE
  // A chunk ends where the document does: it is compressed before the question comes.
  if (service != nullptr && service->CompressesAtDocumentEnd()) {
    opt.prefill_split = document_tokens;
  }
#endif
  opt.sampling = {static_cast<float>(*temp), static_cast<int32_t>(*top_k),
                  static_cast<float>(*top_p), static_cast<uint64_t>(*seed)};
  const std::string attention = flags->Get("attention", "store");
  if (attention != "store" && attention != "fetch") {
    return absl::InvalidArgumentError("--attention is store or fetch");
  }
  opt.path = attention == "fetch" ? AttentionPath::kFetchLocal : AttentionPath::kStoreAttend;
  opt.stop_ids = {tok.eos_id(), tok.TokenId("<|endoftext|>")};
  opt.on_token = [&](int32_t id) { std::cout << tok.TokenText(id) << std::flush; };
  auto result = Generate(**model, kv, ids, opt);
  if (!result.ok()) return result.status();
  std::cout << "\n";
  const KvGeometry g = kv.geometry();
  // Every fed token has K/V; the last sampled token is never fed back.
  const int64_t total = result->prompt_tokens + result->decode_steps;
  const int64_t full_slots = int64_t{g.num_layers} * g.num_kv_heads * total;
  const int64_t slot_bytes_f16 = int64_t{2} * 2 * g.head_dim;  // K and V
  std::cerr << absl::StrFormat(
      "[kvc-worker] %s | prompt %d tokens, prefill %.2f s (%.1f tok/s) | decode %d tokens, "
      "%.2f s (%.1f tok/s)\n[kvc-worker] KV stored %d of %d token-slots (%.1f%%); as f16: %.2f MB "
      "vs full %.2f MB\n",
      kv.Describe(), result->prompt_tokens, result->prefill_seconds,
      result->prompt_tokens / std::max(result->prefill_seconds, 1e-9), result->tokens.size(),
      result->decode_seconds, result->decode_steps / std::max(result->decode_seconds, 1e-9),
      kv.StoredTokenSlots(), full_slots,
      100.0 * kv.StoredTokenSlots() / std::max<int64_t>(full_slots, 1),
      kv.StoredTokenSlots() * slot_bytes_f16 / 1e6, full_slots * slot_bytes_f16 / 1e6);
#ifdef KVC_WORKER_WITH_SERVICE
  if (service != nullptr) {
    auto info = service->Info();
    if (!info.ok()) return info.status();
    const double dense = static_cast<double>(full_slots * slot_bytes_f16);
    std::cerr << absl::StrFormat(
        "[kvc-worker] kvcached holds %.3f MB of %s blocks for %d tokens; a full f16 cache is "
        "%.3f MB: %.1fx smaller. %d Attend calls, %d Fetch calls (fetch path: %s; append "
        "path: %s)\n",
        info->bytes / 1e6, client::StorageFormatName(info->storage), info->visible_tokens,
        dense / 1e6, dense / std::max<double>(static_cast<double>(info->bytes), 1.0),
        service->attend_calls(), service->fetch_calls(), client->DataPath(), client->AppendPath());
  }
#endif
  return absl::OkStatus();
}

}  // namespace kvc::worker
