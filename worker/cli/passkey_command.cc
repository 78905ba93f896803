// kvc-worker passkey: passkey retrieval grid (lengths x depths x local policies).
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "worker/cli/commands.h"
#include "worker/eval/passkey.h"

namespace kvc::worker {

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
        absl::CEscape(s.generated));  // one line per score even when the answer has newlines
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

}  // namespace kvc::worker
