#include "cachesvc/core/plan/eviction_rule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

using Eviction = CompressionSpec::Eviction;

EvictionRule ResolveEviction(const CompressionSpec& s) {
  EvictionRule r;
  r.why = s.eviction;
  switch (s.eviction) {
    case Eviction::kNone:
      break;
    case Eviction::kStreamingLlm:
      r.sinks = s.sinks;
      r.recent = s.window;
      r.rerotate = s.rerotate_keys;
      break;
    case Eviction::kSnapKv:
      r.recent = s.window;
      r.budget = s.budget - s.window;
      r.scored = true;
      r.adaptive = s.adaptive;
      r.floor_percent = s.head_floor_percent;
      r.pyramid_beta = s.pyramid_beta;
      break;
    case Eviction::kH2o:
      r.recent = s.recent;
      r.budget = s.heavy;
      r.scored = true;
      break;
    case Eviction::kExpectedAttention:
      r.sinks = s.sinks;
      r.recent = s.window;
      r.budget = s.budget - s.sinks - s.window;
      r.scored = true;
      r.adaptive = s.adaptive;
      r.floor_percent = s.head_floor_percent;
      break;
  }
  return r;
}

int32_t LayerBudget(const EvictionRule& rule, int layer, int num_layers, int64_t candidates) {
  if (rule.pyramid_beta < 2 || num_layers < 2) return rule.budget;
  // PyramidKV (KVCache-Factory PyramidKVCluster): min = B / beta, max = 2B - min; when the
  // prompt has fewer candidates than max, max = candidates and min = 2B - max.
  const int64_t b = rule.budget;
  int64_t lo = b / rule.pyramid_beta;
  int64_t hi = 2 * b - lo;
  if (hi > candidates) {
    hi = std::max<int64_t>(candidates, 0);
    lo = std::max<int64_t>(2 * b - hi, 0);
  }
  const double step = static_cast<double>(hi - lo) / (num_layers - 1);
  const int64_t mine = std::llround(static_cast<double>(hi) - layer * step);
  return static_cast<int32_t>(std::clamp<int64_t>(mine, 0, std::numeric_limits<int32_t>::max()));
}

namespace {

// Every token count of the spec's eviction at most kMaxPolicyTokens (checked before the
// sums the other checks form).
absl::Status CheckTokenCounts(const CompressionSpec& s) {
  std::vector<std::pair<const char*, int>> counts;
  switch (s.eviction) {
    case Eviction::kNone:
      break;
    case Eviction::kStreamingLlm:
      counts = {{"streaming_llm.sinks", s.sinks}, {"streaming_llm.window", s.window}};
      break;
    case Eviction::kSnapKv:
      counts = {{"snapkv.budget", s.budget}};  // window: at most kMaxScoringQueries
      break;
    case Eviction::kH2o:
      counts = {{"h2o.heavy", s.heavy}, {"h2o.recent", s.recent}};
      break;
    case Eviction::kExpectedAttention:
      counts = {{"expected_attention.sinks", s.sinks},
                {"expected_attention.window", s.window},
                {"expected_attention.budget", s.budget}};
      break;
  }
  for (const auto& [field, n] : counts) {
    if (n > kMaxPolicyTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " is ", n, "; at most ", kMaxPolicyTokens, " tokens"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* EvictionName(Eviction eviction) {
  switch (eviction) {
    case Eviction::kNone:
      return "none";
    case Eviction::kStreamingLlm:
      return "streaming_llm";
    case Eviction::kSnapKv:
      return "snapkv";
    case Eviction::kH2o:
      return "h2o";
    case Eviction::kExpectedAttention:
      return "expected_attention";
  }
  return "?";
}

absl::Status ValidateSpec(const CompressionSpec& s, const PoolGeometry& g, bool automatic) {
  if (s.storage_set && !kernels::FormatSupportsHeadDim(s.storage, g.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage ", kernels::StorageFormatName(s.storage), " cannot store head_dim ",
                     g.head_dim, " (its quantization groups must tile head_dim)"));
  }
  if (s.residual_tokens < 0 || s.residual_tokens > kMaxPolicyTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("residual_tokens is ", s.residual_tokens, "; expected 0..", kMaxPolicyTokens));
  }
  KVC_RETURN_IF_ERROR(CheckTokenCounts(s));
  switch (s.eviction) {
    case Eviction::kNone:
      break;
    case Eviction::kStreamingLlm:
      if (s.sinks < 0 || s.window < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("streaming_llm needs sinks >= 0 and window >= 1; got sinks ", s.sinks,
                         ", window ", s.window));
      }
      if (s.rerotate_keys) {
        if (!g.rope.enabled) {
          return absl::FailedPreconditionError(
              "streaming_llm.rerotate_keys needs the pool's RoPE parameters (geometry.rope)");
        }
      }
      break;
    case Eviction::kSnapKv:
      if (s.window < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("snapkv.window is ", s.window, "; expected >= 1 (paper: 32)"));
      }
      if (s.budget <= s.window) {
        return absl::InvalidArgumentError(
            absl::StrCat("snapkv.budget is ", s.budget, "; it must be larger than window (",
                         s.window, ") so some prompt tokens are selected"));
      }
      if (s.window > kMaxScoringQueries) {
        return absl::InvalidArgumentError(absl::StrCat("snapkv.window is ", s.window, "; at most ",
                                                       kMaxScoringQueries,
                                                       " observation queries (paper: 32)"));
      }
      if (s.pooling_kernel < 1 || s.pooling_kernel % 2 == 0 ||
          s.pooling_kernel > kMaxPoolingKernel) {
        return absl::InvalidArgumentError(
            absl::StrCat("snapkv.pooling_kernel is ", s.pooling_kernel,
                         "; expected an odd number 1..", kMaxPoolingKernel, " (paper: 7)"));
      }
      if (s.head_floor_percent < 0 || s.head_floor_percent > 100) {
        return absl::InvalidArgumentError(absl::StrCat("snapkv.head_floor_percent is ",
                                                       s.head_floor_percent,
                                                       "; expected 0..100 (AdaKV: 20)"));
      }
      if (s.pyramid_beta < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("snapkv.pyramid_beta is ", s.pyramid_beta,
                         "; expected 0 or 1 (every layer the same) or >= 2 (PyramidKV: 20)"));
      }
      if (automatic) {
        return absl::InvalidArgumentError(
            "snapkv needs the observation-window queries, so it cannot be an automatic policy; "
            "apply it with Compress at the end of prefill");
      }
      break;
    case Eviction::kH2o:
      if (s.heavy < 0 || s.recent < 0 || s.heavy + s.recent < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("h2o needs heavy >= 0, recent >= 0 and heavy + recent >= 1; got heavy ",
                         s.heavy, ", recent ", s.recent));
      }
      break;
    case Eviction::kExpectedAttention:
      if (s.sinks < 0 || s.window < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("expected_attention needs sinks >= 0 and window >= 0; got sinks ", s.sinks,
                         ", window ", s.window));
      }
      if (int64_t{s.budget} <= int64_t{s.sinks} + s.window) {
        return absl::InvalidArgumentError(absl::StrCat(
            "expected_attention.budget is ", s.budget, "; it must be larger than sinks + window (",
            int64_t{s.sinks} + s.window, ") so some tokens are selected by score"));
      }
      if (s.future_positions < 1 || s.future_positions > kMaxFuturePositions) {
        return absl::InvalidArgumentError(absl::StrCat("expected_attention.future_positions is ",
                                                       s.future_positions, "; expected 1..",
                                                       kMaxFuturePositions, " (kvpress: 512)"));
      }
      if (s.head_floor_percent < 0 || s.head_floor_percent > 100) {
        return absl::InvalidArgumentError(absl::StrCat("expected_attention.head_floor_percent is ",
                                                       s.head_floor_percent,
                                                       "; expected 0..100 (AdaKV: 20)"));
      }
      if (!g.rope.enabled) {
        return absl::FailedPreconditionError(
            "expected_attention needs the pool's RoPE parameters (geometry.rope): the query "
            "statistics are sent before RoPE and rotated to the positions still to come");
      }
      if (automatic) {
        return absl::InvalidArgumentError(
            "expected_attention needs the context's query statistics, so it cannot be an "
            "automatic policy; apply it with Compress at the end of the document");
      }
      break;
  }
  const int64_t protect = ProtectedRecent(s);
  if (s.residual_tokens > 0 && protect >= 0 && s.residual_tokens > protect) {
    return absl::InvalidArgumentError(absl::StrCat(
        "residual_tokens (", s.residual_tokens, ") is larger than the newest tokens ",
        EvictionName(s.eviction), " always keeps (", protect,
        "): the raw residual holds the newest tokens, so it must fit in the policy's recent "
        "window (",
        s.eviction == Eviction::kH2o ? "h2o.recent" : "window", ")"));
  }
  return absl::OkStatus();
}

int64_t ProtectedRecent(const CompressionSpec& s) {
  switch (s.eviction) {
    case Eviction::kNone:
      return -1;
    case Eviction::kStreamingLlm:
    case Eviction::kSnapKv:
    case Eviction::kExpectedAttention:
      return s.window;
    case Eviction::kH2o:
      return s.recent;
  }
  return -1;
}

}  // namespace kvc::cachesvc
