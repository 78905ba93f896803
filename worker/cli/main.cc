// kvc-worker: runs the reference engine with a local KV store (the service-backed store comes
// with the client library).
//   kvc-worker generate   --prompt TEXT | --prompt-file FILE [--question Q] [--policy P] ...
//   kvc-worker perplexity --text-file FILE [--max-tokens N] [--policies P1,P2,...] [--json OUT]
//   kvc-worker passkey    [--haystack-file FILE] [--lengths L1,L2] [--depths D1,D2] ...
//   kvc-worker tokenize   --text TEXT | --text-file FILE
// Policies (local baselines): full | window=W | streaming=S+W (S sinks + W recent tokens) |
// streaming-rerotate=S+W (the same, sinks re-rotated next to the window).
#include <cstdio>
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
#include "worker/cli/flags.h"
#include "worker/engine/chat_template.h"
#include "worker/engine/generator.h"
#include "worker/engine/llama_model.h"
#include "worker/engine/local_kv_store.h"
#include "worker/eval/passkey.h"
#include "worker/eval/perplexity.h"

namespace kvc::worker {
namespace {

constexpr char kDefaultModel[] = KVC_REPO_ROOT "/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf";

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Parses a local policy spec; nullptr policy means the full cache.
absl::StatusOr<std::unique_ptr<LocalEvictionPolicy>> ParsePolicy(const std::string& spec) {
  if (spec == "full" || spec == "none") return std::unique_ptr<LocalEvictionPolicy>();
  const std::vector<std::string> kv = absl::StrSplit(spec, absl::MaxSplits('=', 1));
  if (kv.size() == 2 && kv[0] == "window") {
    int64_t w;
    if (absl::SimpleAtoi(kv[1], &w) && w > 0) return MakeLocalWindowPolicy(w);
  }
  if (kv.size() == 2 && (kv[0] == "streaming" || kv[0] == "streaming-rerotate")) {
    const std::vector<std::string> sw = absl::StrSplit(kv[1], '+');
    int64_t s, w;
    if (sw.size() == 2 && absl::SimpleAtoi(sw[0], &s) && absl::SimpleAtoi(sw[1], &w) && s >= 0 &&
        w > 0) {
      return MakeLocalSinkWindowPolicy(s, w, /*close_gaps=*/kv[0] == "streaming-rerotate");
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "bad policy '", spec,
      "': use full, window=W, streaming=S+W or streaming-rerotate=S+W (e.g. streaming=4+1020)"));
}

// Splits "a,b,c" into numbers.
template <typename T>
absl::StatusOr<std::vector<T>> ParseList(const std::string& csv) {
  std::vector<T> out;
  for (absl::string_view item : absl::StrSplit(csv, ',')) {
    double v;
    if (!absl::SimpleAtod(item, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("bad number '", item, "' in '", csv, "'"));
    }
    out.push_back(static_cast<T>(v));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LoadModel(const Flags& flags) {
  auto threads = flags.GetInt("threads", 0);
  if (!threads.ok()) return threads.status();
  const std::string path = flags.Get("model", kDefaultModel);
  auto model = LlamaModel::Load(path, static_cast<int>(*threads));
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat(model.status().message(),
                                     "\n(run scripts/fetch_model.sh to download the model)"));
  }
  return model;
}

absl::Status RunGenerate(int argc, char** argv) {
  auto flags = Flags::Parse(
      argc, argv, 2,
      {"model", "threads", "prompt", "prompt-file", "question", "raw", "max-new-tokens",
       "temperature", "top-k", "top-p", "seed", "policy", "attention", "chunk"},
      {"raw"});
  if (!flags.ok()) return flags.status();
  std::string prompt = flags->Get("prompt", "");
  if (flags->Has("prompt-file")) {
    auto text = ReadFile(flags->Get("prompt-file", ""));
    if (!text.ok()) return text.status();
    prompt = *text;
    if (flags->Has("question")) prompt += "\n\n" + flags->Get("question", "");
  }
  if (prompt.empty()) return absl::InvalidArgumentError("give --prompt or --prompt-file");
  auto model = LoadModel(*flags);
  if (!model.ok()) return model.status();
  const BpeTokenizer& tok = (*model)->tokenizer();
  const bool raw = flags->Has("raw");
  const std::string text = raw ? prompt : ApplyChatTemplate({{"user", prompt}}, true);
  const std::vector<int32_t> ids = tok.Encode(text, /*parse_special=*/!raw);

  auto policy = ParsePolicy(flags->Get("policy", "full"));
  if (!policy.ok()) return policy.status();
  LocalKvStore kv((*model)->config().kv_geometry(), std::move(*policy), (*model)->pool());

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
  return absl::OkStatus();
}

absl::Status RunPerplexity(int argc, char** argv) {
  auto flags = Flags::Parse(argc, argv, 2,
                            {"model", "threads", "text-file", "max-tokens", "skip-tokens",
                             "policies", "chunk", "segment", "json"},
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
  for (size_t p = 0; p < specs.size(); ++p) {
    auto policy = ParsePolicy(specs[p]);
    if (!policy.ok()) return policy.status();
    LocalKvStore kv((*model)->config().kv_geometry(), std::move(*policy), (*model)->pool());
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

absl::Status RunPasskey(int argc, char** argv) {
  auto flags = Flags::Parse(argc, argv, 2,
                            {"model", "threads", "haystack-file", "lengths", "depths", "policies",
                             "chunk", "seed", "json", "chat"},
                            {"chat"});
  if (!flags.ok()) return flags.status();
  auto haystack = ReadFile(flags->Get("haystack-file", KVC_REPO_ROOT "/.cache/corpus/emma.txt"));
  if (!haystack.ok()) return haystack.status();
  auto lengths = ParseList<int64_t>(flags->Get("lengths", "1024,2048,4096"));
  auto depths = ParseList<double>(flags->Get("depths", "0,0.25,0.5,0.75,1"));
  auto chunk = flags->GetInt("chunk", 256);
  auto seed = flags->GetInt("seed", 1234);
  for (const absl::Status& s : {lengths.status(), depths.status(), chunk.status(), seed.status()}) {
    if (!s.ok()) return s;
  }
  std::vector<PolicySpec> specs;
  const std::vector<std::string> names =
      absl::StrSplit(flags->Get("policies", "full,window=512,streaming=4+508"), ',');
  for (const std::string& name : names) {
    if (auto p = ParsePolicy(name); !p.ok()) return p.status();
    specs.push_back({name, [name] { return *ParsePolicy(name); }});
  }
  auto model = LoadModel(*flags);
  if (!model.ok()) return model.status();
  PasskeyOptions opt;
  opt.lengths = *lengths;
  opt.depths = *depths;
  opt.prefill_chunk = static_cast<int32_t>(*chunk);
  opt.seed = static_cast<uint64_t>(*seed);
  opt.chat = flags->Has("chat");
  opt.on_score = [](const PasskeyScore& s) {
    std::cerr << absl::StrFormat(
        "[passkey] %-22s len %5d depth %.2f  logp %7.3f  tf %d  gen %d  %s\n", s.policy,
        s.context_tokens, s.depth, s.answer_logprob, s.teacher_forced_match, s.generated_match,
        s.generated);
  };
  auto scores = RunPasskey(**model, *haystack, specs, opt);
  if (!scores.ok()) return scores.status();

  // Markdown table: per policy and length, accuracy over depths (teacher-forced / generated)
  // and the mean answer log-probability.
  std::cout << "| policy |";
  for (int64_t len : *lengths) std::cout << " " << len << " tok: tf acc / gen acc / mean logp |";
  std::cout << "\n| --- |";
  for (size_t i = 0; i < lengths->size(); ++i) std::cout << " --- |";
  std::cout << "\n";
  std::string json = "{\"scores\": [";
  for (const PolicySpec& spec : specs) {
    std::cout << "| " << spec.name << " |";
    for (size_t li = 0; li < lengths->size(); ++li) {
      int n = 0, tf = 0, gen = 0;
      double logp = 0;
      for (size_t i = 0; i < scores->size(); ++i) {
        const PasskeyScore& s = (*scores)[i];
        const size_t case_index = i / specs.size();
        if (s.policy != spec.name || case_index / depths->size() != li) continue;
        ++n;
        tf += s.teacher_forced_match;
        gen += s.generated_match;
        logp += s.answer_logprob;
      }
      std::cout << absl::StrFormat(" %d/%d / %d/%d / %.2f |", tf, n, gen, n, logp / std::max(n, 1));
    }
    std::cout << "\n";
  }
  for (size_t i = 0; i < scores->size(); ++i) {
    const PasskeyScore& s = (*scores)[i];
    std::string gen;
    for (char c : s.generated) {
      if (c == '"' || c == '\\') gen += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) gen += c;
    }
    absl::StrAppend(
        &json, i ? ",\n  " : "\n  ",
        absl::StrFormat("{\"policy\": \"%s\", \"context_tokens\": %d, \"depth\": %.3f, "
                        "\"answer_logprob\": %.5f, \"teacher_forced_match\": %s, "
                        "\"generated_match\": %s, \"generated\": \"%s\", \"kv_slots\": %d}",
                        s.policy, s.context_tokens, s.depth, s.answer_logprob,
                        s.teacher_forced_match ? "true" : "false",
                        s.generated_match ? "true" : "false", gen, s.kv_slots));
  }
  json += "\n]}\n";
  if (flags->Has("json")) {
    std::ofstream out(flags->Get("json", ""));
    out << json;
    if (!out) return absl::InternalError("cannot write --json file");
  }
  return absl::OkStatus();
}

absl::Status RunTokenize(int argc, char** argv) {
  auto flags = Flags::Parse(argc, argv, 2, {"model", "text", "text-file", "special"}, {"special"});
  if (!flags.ok()) return flags.status();
  std::string text = flags->Get("text", "");
  if (flags->Has("text-file")) {
    auto t = ReadFile(flags->Get("text-file", ""));
    if (!t.ok()) return t.status();
    text = *t;
  }
  auto file = GgufFile::Open(flags->Get("model", kDefaultModel));
  if (!file.ok()) return file.status();
  auto tok = BpeTokenizer::FromGguf(**file);
  if (!tok.ok()) return tok.status();
  for (int32_t id : (*tok)->Encode(text, flags->Has("special"))) std::cout << id << "\n";
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  absl::Status s;
  if (cmd == "generate") {
    s = RunGenerate(argc, argv);
  } else if (cmd == "perplexity") {
    s = RunPerplexity(argc, argv);
  } else if (cmd == "passkey") {
    s = RunPasskey(argc, argv);
  } else if (cmd == "tokenize") {
    s = RunTokenize(argc, argv);
  } else {
    std::cerr << "usage: kvc-worker generate|perplexity|tokenize [flags]\n"
                 "  generate   --prompt TEXT | --prompt-file FILE [--question Q] [--raw]\n"
                 "             [--policy full|window=W|streaming=S+W|streaming-rerotate=S+W]\n"
                 "             [--max-new-tokens N]\n"
                 "             [--temperature T --top-k K --top-p P --seed S]\n"
                 "             [--attention store|fetch] [--threads N] [--model GGUF]\n"
                 "  perplexity --text-file FILE [--max-tokens N] [--skip-tokens N] [--chunk C]\n"
                 "             [--policies full,window=1024,streaming=4+1020] [--json OUT]\n"
                 "  passkey    [--haystack-file FILE] [--lengths 1024,2048] [--depths 0,0.5,1]\n"
                 "             [--policies full,window=512,streaming=4+508] [--chat] [--json OUT]\n"
                 "  tokenize   --text TEXT | --text-file FILE [--special]\n";
    return 2;
  }
  if (!s.ok()) {
    std::cerr << "kvc-worker: " << s << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvc::worker

int main(int argc, char** argv) { return kvc::worker::Main(argc, argv); }
