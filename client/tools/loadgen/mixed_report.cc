#include "client/tools/loadgen/mixed_report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json_string.h"

namespace kvc::loadgen {
namespace {

std::string JsonList(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  quoted.reserve(items.size());
  for (const auto& s : items) quoted.push_back(::kvc::JsonString(s));
  return absl::StrCat("[", absl::StrJoin(quoted, ","), "]");
}

std::string JsonRpcs(const std::map<std::string, RpcSummary>& rpcs) {
  std::vector<std::string> parts;
  for (const auto& [rpc, s] : rpcs) {
    std::vector<std::string> codes;
    for (const auto& [code, n] : s.codes)
      codes.push_back(absl::StrCat(::kvc::JsonString(code), ":", n));
    parts.push_back(absl::StrFormat(
        "%s:{\"count\":%d,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,\"codes\":{%s}}",
        ::kvc::JsonString(rpc), s.latency.count, s.latency.p50_ms, s.latency.p99_ms,
        s.latency.max_ms, absl::StrJoin(codes, ",")));
  }
  return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}

// Calls per status code over every RPC.
std::map<std::string, int64_t> CodeTotals(const std::map<std::string, RpcSummary>& rpcs) {
  std::map<std::string, int64_t> codes;
  for (const auto& [rpc, s] : rpcs)
    for (const auto& [code, n] : s.codes) codes[code] += n;
  return codes;
}

struct RssFigures {
  int64_t start = -1, peak = -1, end = -1;
};
RssFigures RssOf(const std::vector<RssSampler::Sample>& rss) {
  RssFigures f;
  if (rss.empty()) return f;
  f.start = rss.front().kib;
  f.end = rss.back().kib;
  for (const auto& s : rss) f.peak = std::max(f.peak, s.kib);
  return f;
}

}  // namespace

void PrintReport(const MixedReport& r, MixedState& state) {
  std::printf("kvc-loadgen mixed: %d clients, %.1f s of load (%.1f s wall)\n", r.clients,
              r.duration_s, r.wall_s);
  std::printf("  %-20s %8s %9s %9s %9s  %s\n", "RPC", "calls", "p50 ms", "p99 ms", "max ms",
              "codes");
  for (const auto& [rpc, s] : r.rpcs) {
    std::vector<std::string> codes;
    for (const auto& [code, n] : s.codes) codes.push_back(absl::StrCat(code, " ", n));
    std::printf("  %-20s %8lld %9.2f %9.2f %9.2f  %s\n", rpc.c_str(),
                static_cast<long long>(s.latency.count), s.latency.p50_ms, s.latency.p99_ms,
                s.latency.max_ms, absl::StrJoin(codes, ", ").c_str());
  }
  const double d = std::max(r.duration_s, 1e-9);
  std::printf(
      "  sequences %lld, appended %lld tokens (%.0f tokens/s, %.1f MB/s), fetched %.1f MB/s\n",
      static_cast<long long>(state.sequences.load()),
      static_cast<long long>(state.appended_tokens.load()),
      static_cast<double>(state.appended_tokens.load()) / d,
      static_cast<double>(state.appended_bytes.load()) / d / 1e6,
      static_cast<double>(state.fetched_bytes.load()) / d / 1e6);
  std::printf("  verified %lld fetches, %lld token rows: %lld wrong bytes, %lld bad results\n",
              static_cast<long long>(state.fetches_checked.load()),
              static_cast<long long>(state.rows_verified.load()),
              static_cast<long long>(state.wrong_bytes.load()),
              static_cast<long long>(state.bad_fetches.load()));
  std::printf("  RESOURCE_EXHAUSTED %lld (documented message %lld, pool full per message %lld)\n",
              static_cast<long long>(state.resource_exhausted.load()),
              static_cast<long long>(state.re_documented.load()),
              static_cast<long long>(state.re_pool_full.load()));
  {
    kvc::MutexLock lock(&state.mu);
    if (!state.re_free_bytes.empty()) {
      std::vector<double> used = state.re_used_fraction;
      std::sort(used.begin(), used.end());
      std::printf(
          "                     at most %lld bytes free per message; pool used at the next "
          "GetPoolStats: median %.0f%%, min %.0f%%\n",
          static_cast<long long>(
              *std::max_element(state.re_free_bytes.begin(), state.re_free_bytes.end())),
          used.empty() ? -1.0 : 100 * used[used.size() / 2],
          used.empty() ? -1.0 : 100 * used.front());
    }
  }
  std::printf("  unexpected errors %lld\n", static_cast<long long>(state.unexpected.load()));
  const RssFigures rss = RssOf(r.rss);
  if (rss.start >= 0) {
    std::printf("  server RSS         start %lld KiB, peak %lld KiB, end %lld KiB\n",
                static_cast<long long>(rss.start), static_cast<long long>(rss.peak),
                static_cast<long long>(rss.end));
  }
  if (r.expect_server_loss) {
    std::printf("  server loss        %lld clients stopped; last call returned at %lld ms\n",
                static_cast<long long>(state.clients_lost.load()),
                static_cast<long long>(state.last_return_unix_ms.load()));
  } else {
    std::printf(
        "  pool               %s baseline (%lld bytes, %lld sequences) after %.2f s: now "
        "%lld bytes, %lld sequences\n",
        r.pool.back_to_baseline ? "back to" : "NOT back to",
        static_cast<long long>(r.pool.baseline_used_bytes),
        static_cast<long long>(r.pool.baseline_sequences), r.pool.settle_s,
        static_cast<long long>(r.pool.end_used_bytes),
        static_cast<long long>(r.pool.end_sequences));
  }
  kvc::MutexLock lock(&state.mu);
  for (const auto& p : state.problems) std::printf("  WRONG: %s\n", p.c_str());
  for (const auto& p : state.unexpected_examples) std::printf("  UNEXPECTED: %s\n", p.c_str());
}

bool WriteJson(const std::string& path, const MixedReport& r, MixedState& state) {
  const double d = std::max(r.duration_s, 1e-9);
  std::string out = absl::StrFormat(
      "{\"clients\":%d,\"duration_s\":%.3f,\"wall_s\":%.3f,\"failed\":%s,\n\"rpcs\":%s,\n",
      r.clients, r.duration_s, r.wall_s, r.failed ? "true" : "false", JsonRpcs(r.rpcs));
  std::vector<std::string> codes;
  for (const auto& [code, n] : CodeTotals(r.rpcs))
    codes.push_back(absl::StrCat(::kvc::JsonString(code), ":", n));
  absl::StrAppend(&out, "\"codes\":{", absl::StrJoin(codes, ","), "},\n");
  absl::StrAppendFormat(
      &out,
      "\"sequences\":%d,\"appended_tokens\":%d,\"tokens_per_s\":%.1f,\"append_mb_s\":%.2f,"
      "\"fetch_mb_s\":%.2f,\"compressions\":%d,\"attends\":%d,\n",
      state.sequences.load(), state.appended_tokens.load(),
      static_cast<double>(state.appended_tokens.load()) / d,
      static_cast<double>(state.appended_bytes.load()) / d / 1e6,
      static_cast<double>(state.fetched_bytes.load()) / d / 1e6, state.compressions.load(),
      state.attends.load());
  absl::StrAppendFormat(&out,
                        "\"fetches_checked\":%d,\"rows_verified\":%d,\"wrong_bytes\":%d,"
                        "\"missing_rows\":%d,\"bad_results\":%d,\"unexpected_errors\":%d,\n",
                        state.fetches_checked.load(), state.rows_verified.load(),
                        state.wrong_bytes.load(), state.missing_rows.load(),
                        state.bad_fetches.load(), state.unexpected.load());
  {
    kvc::MutexLock lock(&state.mu);
    std::vector<double> used = state.re_used_fraction;
    std::sort(used.begin(), used.end());
    const double min_used = used.empty() ? -1 : used.front();
    const double median_used = used.empty() ? -1 : used[used.size() / 2];
    const int64_t max_free =
        state.re_free_bytes.empty()
            ? -1
            : *std::max_element(state.re_free_bytes.begin(), state.re_free_bytes.end());
    absl::StrAppendFormat(&out,
                          "\"resource_exhausted\":{\"count\":%d,\"documented\":%d,\"pool_full\":%d,"
                          "\"max_free_bytes_in_message\":%d,\"stats_after\":%d,"
                          "\"min_used_fraction_after\":%.4f,\"median_used_fraction_after\":%.4f,"
                          "\"examples\":%s},\n",
                          state.resource_exhausted.load(), state.re_documented.load(),
                          state.re_pool_full.load(), max_free, used.size(), min_used, median_used,
                          JsonList(state.re_examples));
    absl::StrAppend(&out, "\"problems\":", JsonList(state.problems), ",\n",
                    "\"unexpected_examples\":", JsonList(state.unexpected_examples), ",\n");
  }
  const RssFigures rss = RssOf(r.rss);
  std::vector<std::string> samples;
  for (const auto& s : r.rss) samples.push_back(absl::StrFormat("[%.1f,%d]", s.t_s, s.kib));
  absl::StrAppendFormat(&out,
                        "\"rss_kib\":{\"start\":%d,\"peak\":%d,\"end\":%d,\"samples\":[%s]},\n",
                        rss.start, rss.peak, rss.end, absl::StrJoin(samples, ","));
  std::vector<std::string> windows;
  for (const auto& w : r.windows) {
    windows.push_back(
        absl::StrFormat("{\"t_s\":%.1f,\"rss_kib\":%d,\"pool_used_fraction\":%.4f,"
                        "\"rpcs\":%s}",
                        w.t_s, w.rss_kib, w.pool_used_fraction, JsonRpcs(w.rpcs)));
  }
  absl::StrAppend(&out, "\"windows\":[", absl::StrJoin(windows, ",\n"), "],\n");
  absl::StrAppendFormat(&out,
                        "\"pool\":{\"capacity_bytes\":%d,\"baseline_used_bytes\":%d,"
                        "\"baseline_sequences\":%d,\"end_used_bytes\":%d,\"end_sequences\":%d,"
                        "\"back_to_baseline\":%s,\"settle_s\":%.3f},\n",
                        r.pool.capacity_bytes, r.pool.baseline_used_bytes,
                        r.pool.baseline_sequences, r.pool.end_used_bytes, r.pool.end_sequences,
                        r.pool.back_to_baseline ? "true" : "false", r.pool.settle_s);
  absl::StrAppendFormat(&out,
                        "\"server_loss\":{\"expected\":%s,\"clients_lost\":%d,"
                        "\"first_loss_unix_ms\":%d,\"last_return_unix_ms\":%d}}\n",
                        r.expect_server_loss ? "true" : "false", state.clients_lost.load(),
                        state.first_loss_unix_ms.load(), state.last_return_unix_ms.load());
  std::ofstream file(path);
  file << out;
  return static_cast<bool>(file);
}

}  // namespace kvc::loadgen
