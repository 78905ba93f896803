#include "worker/service/service_policy_parse.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvc::worker {
namespace {

using client::CompressionSpec;
using client::StorageFormat;

absl::StatusOr<std::vector<int>> Numbers(absl::string_view text, char sep, size_t count,
                                         const std::string& what) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, sep)) {
    int v;
    if (!absl::SimpleAtoi(part, &v) || v < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad number '", part, "' in ", what));
    }
    out.push_back(v);
  }
  // '/' lists may stop early: BUDGET[/WINDOW[/KERNEL]].
  if (out.size() != count && !(sep == '/' && !out.empty() && out.size() < count)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what));
  }
  return out;
}

struct Storage {
  StorageFormat format = StorageFormat::kPoolDefault;
  int residual = 0;  // newest tokens kept raw beside `format`
};

// FORMAT or FORMAT+rawN (the newest N tokens of every lane stay raw).
absl::StatusOr<Storage> ParseStorage(const std::string& text) {
  Storage out;
  absl::string_view s = text;
  if (const size_t plus = s.find("+raw"); plus != absl::string_view::npos) {
    if (!absl::SimpleAtoi(s.substr(plus + 4), &out.residual) || out.residual < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad --storage '", text, "': after +raw comes the number of raw recent tokens"));
    }
    s = s.substr(0, plus);
  }
  // Every format by its name (client::StorageFormatName: the kernels' table, "?" past the
  // last), and the short forms the worker has always taken.
  out.format = StorageFormat::kPoolDefault;
  if (s.empty()) return out;
  for (int v = 1; std::string(client::StorageFormatName(static_cast<StorageFormat>(v))) != "?";
       ++v) {
    if (s == client::StorageFormatName(static_cast<StorageFormat>(v))) {
      out.format = static_cast<StorageFormat>(v);
      return out;
    }
  }
  if (s == "fp8") {
    out.format = StorageFormat::kFp8E4M3;
  } else if (s == "int4" || s == "int4g32") {
    out.format = StorageFormat::kInt4G32;
  } else if (s == "int4g64") {
    out.format = StorageFormat::kInt4G64;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown --storage '", text,
        "'; use a format's name (f16, bf16, f32, fp8_e4m3 or fp8, int8, int4_g32 or int4, "
        "int4_g64, nvfp4), optionally with "
        "+rawN (e.g. int4+raw32: the newest 32 tokens stay raw)"));
  }
  return out;
}

}  // namespace

absl::StatusOr<ServicePolicy> ParseServicePolicy(const std::string& policy,
                                                 const std::string& storage) {
  ServicePolicy out;
  auto parsed = ParseStorage(storage);
  if (!parsed.ok()) return parsed.status();
  const StorageFormat* format = &parsed->format;
  const int residual = parsed->residual;
  absl::string_view p = policy;
  const std::string what = absl::StrCat("--policy '", policy, "'");
  if (p.empty() || p == "full") {
    out.automatic.storage = *format;
    out.automatic.residual_tokens = residual;
  } else if (absl::ConsumePrefix(&p, "streaming=") ||
             absl::ConsumePrefix(&p, "streaming-rerotate=")) {
    const bool rerotate = absl::StartsWith(policy, "streaming-rerotate=");
    auto n = Numbers(p, '+', 2, what);
    if (!n.ok()) return n.status();
    out.automatic = CompressionSpec::StreamingLlm((*n)[0], (*n)[1]).WithStorage(*format);
    out.automatic.rerotate_keys = rerotate;
    out.automatic.residual_tokens = residual;
  } else if (absl::StrContains(p, "snapkv=") || absl::StrContains(p, "pyramidkv=")) {
    // snapkv=BUDGET[/WINDOW[/KERNEL]]: window 32 (the paper's) and max-pooling kernel 13 (the
    // service's measured default; the paper: 7) unless given.
    // adasnapkv: the budget shared across each layer's kv heads by score (AdaKV, floor 20 %);
    // pyramidkv / adapyramidkv: PyramidKV's per-layer budgets (beta 20) on top.
    const bool adaptive = absl::ConsumePrefix(&p, "ada");
    const bool pyramid = absl::ConsumePrefix(&p, "pyramidkv=");
    if (!pyramid && !absl::ConsumePrefix(&p, "snapkv=")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad ", what,
          "; use snapkv=, adasnapkv=, pyramidkv= or adapyramidkv=BUDGET[/WINDOW[/KERNEL]]"));
    }
    auto n = Numbers(p, '/', 3, what);
    if (!n.ok()) return n.status();
    const int window = n->size() > 1 ? (*n)[1] : 32;
    const int pooling_kernel = n->size() > 2 ? (*n)[2] : 13;
    // Prefill stays raw (scores on exact keys); the survivors are converted at Compress and
    // later tokens are written in the new format.
    // The residual is set by that Compress too: the newest tokens are still raw then.
    out.at_prompt_end =
        CompressionSpec::SnapKv(window, (*n)[0], pooling_kernel).WithStorage(*format);
    if (adaptive) out.at_prompt_end.Adaptive();
    if (pyramid) out.at_prompt_end.pyramid_beta = 20;
    out.at_prompt_end.residual_tokens = residual;
    out.compress_at_prompt_end = true;
    out.query_window = window;
  } else if (absl::StrContains(p, "expattn=")) {
    // expattn=BUDGET[/WINDOW]: Expected Attention (query-agnostic; kvpress's sinks 4). The
    // budget counts the 4 sinks and the recent window, which is 32 unless given: SnapKV's
    // observation window, so the same budget keeps the same tokens per kv head as snapkv=.
    // adaexpattn: the budget shared across each layer's kv heads by score (AdaKV).
    const bool adaptive = absl::ConsumePrefix(&p, "ada");
    if (!absl::ConsumePrefix(&p, "expattn=")) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad ", what, "; use expattn= or adaexpattn=BUDGET[/WINDOW]"));
    }
    auto n = Numbers(p, '/', 2, what);
    if (!n.ok()) return n.status();
    const int budget = (*n)[0];
    const int window = n->size() > 1 ? (*n)[1] : 32;
    if (budget <= kExpectedAttentionSinks + window) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad ", what, ": the budget must exceed the ", kExpectedAttentionSinks,
                       " sinks + the window (", window, ") it includes"));
    }
    // As SnapKV: prefill stays raw, survivors are converted (and the residual set) at Compress.
    out.at_prompt_end = CompressionSpec::ExpectedAttention(window, budget, kExpectedAttentionSinks)
                            .WithStorage(*format);
    if (adaptive) out.at_prompt_end.Adaptive();
    out.at_prompt_end.residual_tokens = residual;
    out.compress_at_prompt_end = true;
    out.query_window = 0;  // statistics of every prompt query instead
  } else if (absl::ConsumePrefix(&p, "h2o=")) {
    auto n = Numbers(p, '+', 2, what);
    if (!n.ok()) return n.status();
    // Prefill scores from the last 32 prompt queries, then H2O keeps running on every
    // append with the scores each decode step's Attend adds.
    out.automatic = CompressionSpec::H2o((*n)[0], (*n)[1]).WithStorage(*format);
    out.automatic.residual_tokens = residual;
    out.at_prompt_end = CompressionSpec::H2o((*n)[0], (*n)[1]);
    out.compress_at_prompt_end = true;
    out.query_window = 32;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ", what,
                     "; use full, streaming=SINKS+WINDOW, [ada]snapkv=BUDGET[/WINDOW], "
                     "[ada]pyramidkv=BUDGET[/WINDOW], [ada]expattn=BUDGET[/WINDOW] or "
                     "h2o=HEAVY+RECENT"));
  }
  return out;
}

}  // namespace kvc::worker
