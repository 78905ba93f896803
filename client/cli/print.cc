#include "client/cli/print.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/admin_json.h"
#include "client/cli/table.h"

namespace kvc::cli {

using client::DType;
using client::StorageFormat;

namespace {

// A quota as shown: "unlimited" for 0.
std::string Limit(int64_t value) { return value == 0 ? "unlimited" : absl::StrCat(value); }
std::string ByteLimit(int64_t value) { return value == 0 ? "unlimited" : FormatBytes(value); }

}  // namespace

const char* DTypeLabel(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    default:
      return "?";
  }
}

std::string FormatName(StorageFormat format) {
  std::string name = StorageFormatProtoName(format);
  const std::string prefix = "STORAGE_FORMAT_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

int Report(const absl::Status& status, const std::string& target) {
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    std::fprintf(stderr,
                 "kvcachectl: cannot reach kvcached at %s: %s\n"
                 "  is kvcached running there? set the address with --target=host:port\n"
                 "  (TLS: does it serve TLS, and does its certificate chain to --tls_ca and name\n"
                 "  the target or --tls_server_name?)\n",
                 target.c_str(), std::string(status.message()).c_str());
    return 2;
  }
  // The code's name is what a person can look up.
  std::fprintf(stderr, "kvcachectl: %s: %s\n", absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  return 3;
}

void PrintPools(const std::vector<client::PoolInfo>& pools) {
  Table table({"POOL", "DEVICE", "LAYERS", "KV_HEADS", "Q_HEADS", "HEAD_DIM", "DTYPE", "BLOCK",
               "CAPACITY", "USED", "FREE_BLOCKS", "SEQUENCES"});
  for (const client::PoolInfo& p : pools) {
    const client::PoolGeometry& g = p.geometry;
    table.AddRow({p.name, p.device, absl::StrCat(g.num_layers), absl::StrCat(g.num_kv_heads),
                  absl::StrCat(g.num_query_heads), absl::StrCat(g.head_dim), DTypeLabel(g.dtype),
                  absl::StrCat(g.block_tokens, " tok/", FormatBytes(p.block_bytes)),
                  FormatBytes(p.capacity_bytes), FormatBytes(p.used_bytes),
                  absl::StrCat(p.free_blocks, "/", p.total_blocks), absl::StrCat(p.sequences)});
  }
  std::cout << table.Render();
}

void PrintSequences(const client::SequenceList& list) {
  Table table(
      {"SEQUENCE", "POOL", "TENANT", "TOKENS", "STORED_TOKEN_HEADS", "BYTES", "RATIO", "FORMATS"});
  for (const client::SequenceInfo& s : list.sequences) {
    std::string formats;
    for (const auto& fb : s.bytes_by_format) {
      absl::StrAppend(&formats, formats.empty() ? "" : ",", FormatName(fb.format));
    }
    table.AddRow({s.sequence_id, s.pool, s.tenant.empty() ? "-" : s.tenant,
                  absl::StrCat(s.visible_tokens), absl::StrCat(s.stored_token_heads),
                  FormatBytes(s.bytes), absl::StrFormat("%.2f", s.compression_ratio),
                  formats.empty() ? "-" : formats});
  }
  std::cout << table.Render();
  if (!list.next_page_token.empty()) {
    std::cout << "(" << list.sequences.size() << " of " << list.total
              << " sequences shown; the next page: --page_token=" << list.next_page_token << ")\n";
  }
}

void SortSequences(std::vector<client::SequenceInfo>* sequences, const std::string& by) {
  std::stable_sort(sequences->begin(), sequences->end(),
                   [&](const client::SequenceInfo& a, const client::SequenceInfo& b) {
                     if (by == "tokens") return a.visible_tokens > b.visible_tokens;
                     if (by == "bytes") return a.bytes > b.bytes;
                     if (by == "id") return a.sequence_id < b.sequence_id;
                     return a.created_unix_ms < b.created_unix_ms;
                   });
}

void PrintSequence(const client::SequenceInfo& s) {
  Table table({"FIELD", "VALUE"});
  table.AddRow({"sequence", s.sequence_id});
  table.AddRow({"pool", s.pool});
  table.AddRow({"tenant", s.tenant.empty() ? "-" : s.tenant});
  table.AddRow({"visible tokens", absl::StrCat(s.visible_tokens)});
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t n : s.layer_tokens) {
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  table.AddRow({"layer tokens",
                s.layer_tokens.empty() ? "-"
                : lo == hi
                    ? absl::StrCat(lo, " in each of ", s.layer_tokens.size(), " layers")
                    : absl::StrCat(lo, "..", hi, " over ", s.layer_tokens.size(), " layers")});
  table.AddRow({"stored token-heads", absl::StrCat(s.stored_token_heads)});
  table.AddRow({"bytes", FormatBytes(s.bytes)});
  for (const auto& fb : s.bytes_by_format) {
    table.AddRow({absl::StrCat("bytes ", FormatName(fb.format)),
                  absl::StrCat(FormatBytes(fb.bytes), " in ", fb.blocks, " blocks")});
  }
  table.AddRow({"compression ratio", absl::StrFormat("%.2f", s.compression_ratio)});
  table.AddRow({"created (unix ms)", absl::StrCat(s.created_unix_ms)});
  std::cout << table.Render();
}

void PrintTenants(const std::vector<client::TenantUsage>& tenants) {
  Table table({"TENANT", "SEQUENCES", "BYTES", "STREAMS", "COMPUTE", "QUOTA BYTES/POOL",
               "QUOTA SEQS", "QUOTA STREAMS", "QUOTA COMPUTE"});
  for (const client::TenantUsage& t : tenants) {
    std::vector<std::string> pools;
    for (const auto& [pool, bytes] : t.pool_bytes) {
      if (bytes > 0) pools.push_back(absl::StrCat(pool, ":", FormatBytes(bytes)));
    }
    std::sort(pools.begin(), pools.end());
    table.AddRow({t.tenant.empty() ? "(none)" : t.tenant, absl::StrCat(t.sequences),
                  pools.empty() ? "0" : absl::StrJoin(pools, " "), absl::StrCat(t.open_streams),
                  absl::StrCat(t.compute_calls), ByteLimit(t.quota_bytes_per_pool),
                  Limit(t.quota_sequences), Limit(t.quota_streams), Limit(t.quota_compute_calls)});
  }
  std::cout << table.Render();
}

void PrintLeases(const std::vector<client::LeaseInfo>& leases, int64_t now_unix_ms) {
  Table table({"LEASE", "TENANT", "SEQUENCE", "POOL", "BYTES", "LEASE-ONLY", "AGE", "EXPIRES IN",
               "RENEWALS"});
  auto seconds = [](int64_t ms) { return absl::StrFormat("%.1fs", static_cast<double>(ms) / 1e3); };
  for (const client::LeaseInfo& l : leases) {
    table.AddRow({l.lease_id, l.tenant.empty() ? "(none)" : l.tenant, l.sequence_id, l.pool,
                  FormatBytes(l.leased_bytes), FormatBytes(l.lease_only_bytes),
                  seconds(now_unix_ms - l.granted_unix_ms),
                  seconds(l.expires_unix_ms - now_unix_ms), absl::StrCat(l.renewals)});
  }
  std::cout << table.Render();
}

void PrintStats(const client::PoolStats& s) {
  Table table({"FIELD", "VALUE"});
  table.AddRow({"pool", s.pool.empty() ? "(all)" : s.pool});
  if (!s.tenant.empty()) {
    // A tenant's own view (authentication on, not an admin): its use and limits only.
    table.AddRow({"tenant", s.tenant});
    table.AddRow({"quota bytes per pool", ByteLimit(s.quota_bytes)});
    table.AddRow({"quota sequences", Limit(s.quota_sequences)});
  }
  table.AddRow({"capacity", FormatBytes(s.capacity_bytes)});
  table.AddRow(
      {"used", absl::StrFormat("%s (%.1f%%)", FormatBytes(s.used_bytes),
                               s.capacity_bytes > 0 ? 100.0 * static_cast<double>(s.used_bytes) /
                                                          static_cast<double>(s.capacity_bytes)
                                                    : 0.0)});
  table.AddRow({"free", FormatBytes(s.free_bytes)});
  table.AddRow({"blocks used/total", absl::StrCat(s.used_blocks, "/", s.total_blocks)});
  table.AddRow({"sequences", absl::StrCat(s.sequences)});
  table.AddRow({"visible tokens", absl::StrCat(s.visible_tokens)});
  table.AddRow({"stored token-heads", absl::StrCat(s.stored_token_heads)});
  for (const auto& fb : s.bytes_by_format) {
    table.AddRow({absl::StrCat("bytes ", FormatName(fb.format)),
                  absl::StrCat(FormatBytes(fb.bytes), " in ", fb.blocks, " blocks")});
  }
  table.AddRow({"appended (total)", FormatBytes(s.appended_bytes_total)});
  table.AddRow({"fetched (total)", FormatBytes(s.fetched_bytes_total)});
  if (s.has_prefix_cache) {
    const client::PoolStats::PrefixCache& c = s.prefix_cache;
    table.AddRow({"prefix entries", absl::StrCat(c.entries)});
    table.AddRow({"prefix cached", FormatBytes(c.cached_bytes)});
    table.AddRow({"prefix unreferenced", FormatBytes(c.unreferenced_bytes)});
    table.AddRow({"prefix lookups", absl::StrCat(c.lookups, " (", c.hits, " hits, ",
                                                 c.evicted_misses, " missed an evicted prefix)")});
    table.AddRow({"prefix hit rate", PrefixHitRate(c)});
    table.AddRow({"prefix attached tokens", absl::StrCat(c.attached_tokens)});
    table.AddRow({"prefix checksum misses", absl::StrCat(c.checksum_misses)});
    table.AddRow({"prefix corrupt reads refused", absl::StrCat(c.corrupt_reads)});
    table.AddRow({"prefix evicted entries", absl::StrCat(c.evicted_entries)});
  }
  if (s.has_leases && s.tenant.empty()) {
    const client::PoolStats::Leases& l = s.leases;
    table.AddRow(
        {"leases active", absl::StrCat(l.active, " pinning ", FormatBytes(l.leased_bytes))});
    table.AddRow(
        {"leases granted", absl::StrCat(l.granted, " (", l.renewed, " renewals, ", l.released,
                                        " released, ", l.expired, " expired)")});
  }
  if (s.has_leases) {
    // Part of "used": blocks no sequence holds, kept (and charged) for leases.
    table.AddRow({"pinned only by leases", FormatBytes(s.leases.lease_only_bytes)});
  }
  std::cout << table.Render();
}

std::string PrefixHitRate(const client::PoolStats::PrefixCache& c) {
  const std::string of = absl::StrCat("(", c.hit_tokens, " of ", c.lookup_tokens, " tokens)");
  if (c.lookup_tokens <= 0) return absl::StrCat("- ", of);
  return absl::StrFormat(
      "%.1f%% %s", 100.0 * static_cast<double>(c.hit_tokens) / static_cast<double>(c.lookup_tokens),
      of);
}

bool ValidSort(const std::string& sort) {
  if (sort == "created" || sort == "tokens" || sort == "bytes" || sort == "id") return true;
  std::cerr << "kvcachectl: --sort=" << sort << " is not one of created, tokens, bytes, id\n";
  return false;
}

}  // namespace kvc::cli
