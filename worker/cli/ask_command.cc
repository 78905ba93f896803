// kvc-worker ask: several questions about one document, each a fresh request with its KV cache
// in kvcached. With --reuse the requests name their prompt's token ids: the first prefills the
// document and publishes it to kvcached's prefix cache, the later ones attach its cached
// blocks and prefill only what follows. Prints each answer with its time to first token, so
// the same command without --reuse is the baseline (the answers must be the same).
// A query-agnostic policy (--policy expattn=...) compresses each request's document before its
// question is prefilled (ServiceKvCache::ExpectDocument), from the document's queries only, so
// every question reads the same compressed document. With --reuse the document is compressed
// once: the first request prefills and compresses it, publishes its raw whole blocks (before
// compressing, for other engines) and forks the compressed document into a sequence kept for
// the command's lifetime (ServiceKvCache::KeepDocument); the later requests fork that
// sequence (copy-on-write: they share its blocks) and prefill only their question.
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "worker/cli/commands.h"
#include "worker/engine/chat_template.h"
#include "worker/engine/generator.h"
#ifdef KVC_WORKER_WITH_SERVICE
#include "common/json_string.h"
#include "kvc/client/kv_cache_client.h"
#include "worker/service/service_kv_cache.h"
#include "worker/service/service_policy_parse.h"
#endif

namespace kvc::worker {

#ifndef KVC_WORKER_WITH_SERVICE
absl::Status RunAsk(int, char**) {
  return absl::FailedPreconditionError(
      "kvc-worker ask needs kvcached: build the full tree (the client library)");
}
#else
namespace {}  // namespace

absl::Status RunAsk(int argc, char** argv) {
  auto flags = Flags::Parse(argc, argv, 2, {"model",       "threads",
                                            "prompt-file", "questions-file",
                                            "reuse",       "model-id",
                                            "salt",        "max-new-tokens",
                                            "chunk",       "policy",
                                            "storage",     "target",
                                            "pool",        "json",
                                            "tls-ca",      "tls-cert",
                                            "tls-key",     "tls-server-name",
                                            "token-file",  "kv"},
                            {"reuse"});
  if (!flags.ok()) return flags.status();
  if (flags->Get("kv", "kvcached") != "kvcached") {
    return absl::InvalidArgumentError(
        "kvc-worker ask keeps the KV cache in kvcached (--kv=kvcached)");
  }
  if (!flags->Has("prompt-file") || !flags->Has("questions-file")) {
    return absl::InvalidArgumentError("give --prompt-file DOC and --questions-file FILE");
  }
  auto document = ReadFile(flags->Get("prompt-file", ""));
  if (!document.ok()) return document.status();
  auto questions_text = ReadFile(flags->Get("questions-file", ""));
  if (!questions_text.ok()) return questions_text.status();
  std::vector<std::string> questions;
  for (absl::string_view line : absl::StrSplit(*questions_text, '\n')) {
    if (!line.empty()) questions.emplace_back(line);
  }
  if (questions.empty()) return absl::InvalidArgumentError("--questions-file has no question");
  auto max_new = flags->GetInt("max-new-tokens", 32);
  auto chunk = flags->GetInt("chunk", 256);
  if (!max_new.ok()) return max_new.status();
  if (!chunk.ok()) return chunk.status();
  auto policy = ParseServicePolicy(flags->Get("policy", "full"), flags->Get("storage", ""));
  if (!policy.ok()) return policy.status();
  const bool reuse = flags->Has("reuse");
  auto model = LoadModel(*flags);
  if (!model.ok()) return model.status();
  const BpeTokenizer& tok = (*model)->tokenizer();
  // The model id names the weights: reuse across processes needs the same id for the same
  // GGUF, and a different one for anything that would change K/V.
  const std::string model_path = flags->Get("model", kDefaultModel);
  const std::string model_id =
      flags->Get("model-id", model_path.substr(model_path.find_last_of('/') + 1));
  auto connected = ConnectToKvcached(*flags);
  if (!connected.ok()) return connected.status();
  std::unique_ptr<client::KvCacheClient> client = std::move(*connected);
  std::ofstream json;
  if (flags->Has("json")) json.open(flags->Get("json", ""));
  // Query-agnostic policy with --reuse: the compressed document the first request kept (empty
  // until then), released when the command ends.
  const bool keep_document = reuse && policy->query_agnostic();
  std::string kept_document;
  absl::Cleanup release_kept = [&client, &kept_document] {
    if (!kept_document.empty()) (void)client->Release(kept_document);
  };
  const std::vector<int32_t> document_ids =
      tok.Encode(ChatDocumentPrefix(*document), /*parse_special=*/true);

  for (size_t q = 0; q < questions.size(); ++q) {
    const std::string text = ApplyChatTemplate({{"user", *document + "\n\n" + questions[q]}},
                                               /*add_generation_prompt=*/true);
    const std::vector<int32_t> ids = tok.Encode(text, /*parse_special=*/true);
    const auto t0 = std::chrono::steady_clock::now();
    // The last prompt token always runs (its logits give the first answer token).
    client::Prefix wanted{model_id, flags->Get("salt", ""),
                          std::vector<int32_t>(ids.begin(), ids.end() - 1)};
    const bool fork = keep_document && !kept_document.empty();
    auto created =
        fork ? ServiceKvCache::Fork(client.get(), kept_document, (*model)->config().kv_geometry(),
                                    *policy, /*always_fetch=*/false, (*model)->pool())
             : ServiceKvCache::Create(client.get(), flags->Get("pool", ""),
                                      (*model)->config().kv_geometry(), *policy,
                                      /*always_fetch=*/false, (*model)->pool(),
                                      reuse && !keep_document ? &wanted : nullptr);
    if (!created.ok()) return created.status();
    ServiceKvCache& kv = **created;
    kv.ExpectPrompt(static_cast<int64_t>(ids.size()));
    const int64_t document_tokens = DocumentTokens(document_ids, ids);
    GenerateOptions opt;
    if (!fork) {
      kv.ExpectDocument(document_tokens);
      if (reuse) kv.PublishAtPromptEnd(client::Prefix{model_id, flags->Get("salt", ""), ids});
      if (kv.CompressesAtDocumentEnd()) opt.prefill_split = document_tokens;
      if (keep_document) kv.KeepDocument();
    }
    opt.max_new_tokens = static_cast<int32_t>(*max_new);
    opt.prefill_chunk = static_cast<int32_t>(*chunk);
    opt.stop_ids = {tok.eos_id(), tok.TokenId("<|endoftext|>")};
    opt.cached_prompt_tokens = fork ? kv.forked_tokens() : kv.attached_tokens();
    double ttft = -1;
    opt.on_token = [&](int32_t) {
      if (ttft < 0) {
        ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    };
    auto result = Generate(**model, kv, ids, opt);
    if (!result.ok()) return result.status();
    if (keep_document && kept_document.empty()) {
      kept_document = kv.kept_document();
      if (kept_document.empty()) {
        return absl::InternalError("the first request's compressed document was not kept");
      }
    }
    const int64_t reused = kv.attached_tokens() + kv.forked_tokens();
    std::cout << absl::StrFormat(
        "question %d: %d prompt tokens, %d attached from the prefix cache, %d from the kept "
        "compressed document, %d prefilled, time to first token %.3f s\n  Q: %s\n  A: %s\n",
        q + 1, ids.size(), kv.attached_tokens(), kv.forked_tokens(), ids.size() - reused, ttft,
        questions[q], result->text);
    if (json.is_open()) {
      json << absl::StrFormat(
          "{\"question\":%s,\"prompt_tokens\":%d,\"attached_tokens\":%d,\"forked_tokens\":%d,"
          "\"published_tokens\":%d,\"ttft_s\":%.4f,\"prefill_s\":%.4f,\"answer\":%s,"
          "\"reuse\":%s}\n",
          ::kvc::JsonString(questions[q]), ids.size(), kv.attached_tokens(), kv.forked_tokens(),
          kv.published().published_tokens, ttft, result->prefill_seconds,
          ::kvc::JsonString(result->text), reuse ? "true" : "false");
    }
  }
  return absl::OkStatus();
}
#endif

}  // namespace kvc::worker
