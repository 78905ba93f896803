#include "client/cli/admin_json.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvc::cli {

namespace {

using client::CompressionSpec;
using client::DType;
using client::StorageFormat;

Json Int64s(const std::vector<int64_t>& values) {
  Json out = Json::Array();
  for (int64_t v : values) out.Push(Json::Int64(v));
  return out;
}

Json Int64Map(const std::vector<std::pair<std::string, int64_t>>& entries) {
  Json out = Json::Object();
  for (const auto& [key, value] : entries) out.Add(key, Json::Int64(value));
  return out;
}

Json FormatBytesJson(const std::vector<client::FormatBytes>& list) {
  Json out = Json::Array();
  for (const client::FormatBytes& fb : list) {
    out.Push(Json::Object()
                 .Add("format", Json::Enum(StorageFormatProtoName(fb.format)))
                 .Add("blocks", Json::Int64(fb.blocks))
                 .Add("bytes", Json::Int64(fb.bytes)));
  }
  return out;
}

const char* AllocationName(bool adaptive) {
  return adaptive ? "ALLOCATION_ADAPTIVE" : "ALLOCATION_UNIFORM";
}

}  // namespace

const char* StorageFormatProtoName(StorageFormat format) {
  switch (format) {
    case StorageFormat::kPoolDefault:
      return "STORAGE_FORMAT_UNSPECIFIED";
    case StorageFormat::kF32:
      return "STORAGE_FORMAT_F32";
    case StorageFormat::kF16:
      return "STORAGE_FORMAT_F16";
    case StorageFormat::kBF16:
      return "STORAGE_FORMAT_BF16";
    case StorageFormat::kFp8E4M3:
      return "STORAGE_FORMAT_FP8_E4M3";
    case StorageFormat::kInt8:
      return "STORAGE_FORMAT_INT8";
    case StorageFormat::kInt4G32:
      return "STORAGE_FORMAT_INT4_G32";
    case StorageFormat::kInt4G64:
      return "STORAGE_FORMAT_INT4_G64";
    case StorageFormat::kNvfp4:
      return "STORAGE_FORMAT_NVFP4";
  }
  return "STORAGE_FORMAT_UNSPECIFIED";
}

const char* DTypeProtoName(DType dtype) {
  switch (dtype) {
    case DType::kPoolDefault:
      return "DTYPE_UNSPECIFIED";
    case DType::kF32:
      return "DTYPE_F32";
    case DType::kF16:
      return "DTYPE_F16";
    case DType::kBF16:
      return "DTYPE_BF16";
  }
  return "DTYPE_UNSPECIFIED";
}

Json JsonOf(const client::PoolInfo& p) {
  const client::PoolGeometry& g = p.geometry;
  Json geometry = Json::Object();
  geometry.Add("num_layers", Json::Int32(g.num_layers))
      .Add("num_kv_heads", Json::Int32(g.num_kv_heads))
      .Add("num_query_heads", Json::Int32(g.num_query_heads))
      .Add("head_dim", Json::Int32(g.head_dim))
      .Add("block_tokens", Json::Int32(g.block_tokens))
      .Add("dtype", Json::Enum(DTypeProtoName(g.dtype)));
  if (g.rope.enabled) {
    geometry.Add("rope", Json::Object()
                             .Add("theta", Json::Double(g.rope.theta))
                             .Add("rotary_dim", Json::Int32(g.rope.rotary_dim))
                             .Add("style", Json::Enum(g.rope.gptj_style ? "ROPE_STYLE_GPTJ"
                                                                        : "ROPE_STYLE_NEOX")));
  }
  Json out = Json::Object();
  out.Add("name", Json::String(p.name))
      .Add("device", Json::String(p.device))
      .Add("geometry", std::move(geometry))
      .Add("capacity_bytes", Json::Int64(p.capacity_bytes))
      .Add("block_bytes", Json::Int64(p.block_bytes))
      .Add("total_blocks", Json::Int64(p.total_blocks))
      .Add("free_blocks", Json::Int64(p.free_blocks))
      .Add("used_bytes", Json::Int64(p.used_bytes))
      .Add("sequences", Json::Int64(p.sequences));
  return out;
}

Json JsonOf(const client::PoolStats& s) {
  Json out = Json::Object();
  out.Add("pool", Json::String(s.pool))
      .Add("capacity_bytes", Json::Int64(s.capacity_bytes))
      .Add("used_bytes", Json::Int64(s.used_bytes))
      .Add("free_bytes", Json::Int64(s.free_bytes))
      .Add("total_blocks", Json::Int64(s.total_blocks))
      .Add("used_blocks", Json::Int64(s.used_blocks))
      .Add("sequences", Json::Int64(s.sequences))
      .Add("visible_tokens", Json::Int64(s.visible_tokens))
      .Add("stored_token_heads", Json::Int64(s.stored_token_heads))
      .Add("bytes_by_format", FormatBytesJson(s.bytes_by_format))
      .Add("appended_bytes_total", Json::Int64(s.appended_bytes_total))
      .Add("fetched_bytes_total", Json::Int64(s.fetched_bytes_total))
      .Add("dense_bytes", Json::Int64(s.dense_bytes))
      .Add("evicted_token_heads", Int64Map(s.evicted_token_heads))
      .Add("tenant", Json::String(s.tenant))
      .Add("quota_bytes", Json::Int64(s.quota_bytes))
      .Add("quota_sequences", Json::Int64(s.quota_sequences));
  if (s.has_prefix_cache) {
    const auto& c = s.prefix_cache;
    out.Add("prefix_cache", Json::Object()
                                .Add("lookups", Json::Int64(c.lookups))
                                .Add("hits", Json::Int64(c.hits))
                                .Add("lookup_tokens", Json::Int64(c.lookup_tokens))
                                .Add("hit_tokens", Json::Int64(c.hit_tokens))
                                .Add("attached_tokens", Json::Int64(c.attached_tokens))
                                .Add("checksum_misses", Json::Int64(c.checksum_misses))
                                .Add("published_entries", Json::Int64(c.published_entries))
                                .Add("evicted_entries", Json::Int64(c.evicted_entries))
                                .Add("entries", Json::Int64(c.entries))
                                .Add("cached_bytes", Json::Int64(c.cached_bytes))
                                .Add("unreferenced_bytes", Json::Int64(c.unreferenced_bytes))
                                .Add("corrupt_reads", Json::Int64(c.corrupt_reads))
                                .Add("evicted_misses", Json::Int64(c.evicted_misses)));
  }
  if (s.has_leases) {
    const auto& l = s.leases;
    out.Add("leases", Json::Object()
                          .Add("active", Json::Int64(l.active))
                          .Add("leased_bytes", Json::Int64(l.leased_bytes))
                          .Add("granted", Json::Int64(l.granted))
                          .Add("renewed", Json::Int64(l.renewed))
                          .Add("released", Json::Int64(l.released))
                          .Add("expired", Json::Int64(l.expired))
                          .Add("lease_only_bytes", Json::Int64(l.lease_only_bytes)));
  }
  return out;
}

Json JsonOf(const CompressionSpec& s) {
  Json out = Json::Object();
  switch (s.eviction) {
    case CompressionSpec::Eviction::kStreamingLlm:
      out.Add("streaming_llm", Json::Object()
                                   .Add("sinks", Json::Int32(s.sinks))
                                   .Add("window", Json::Int32(s.window))
                                   .Add("rerotate_keys", Json::Bool(s.rerotate_keys)));
      break;
    case CompressionSpec::Eviction::kSnapKv: {
      Json k = Json::Object();
      k.Add("window", Json::Int32(s.window))
          .Add("budget", Json::Int32(s.budget))
          .Add("pooling_kernel", Json::Int32(s.pooling_kernel))
          .Add("pooling", Json::Enum(s.pooling_avg ? "POOLING_AVG" : "POOLING_MAX"))
          .Add("allocation", Json::Enum(AllocationName(s.adaptive)));
      k.Add("pyramid_beta", Json::Int32(s.pyramid_beta));
      // proto3 optional fields, when set, come after the others (as protobuf prints them).
      if (s.head_floor_percent >= 0) k.Add("head_floor_percent", Json::Int32(s.head_floor_percent));
      out.Add("snapkv", std::move(k));
      break;
    }
    case CompressionSpec::Eviction::kH2o:
      out.Add(
          "h2o",
          Json::Object().Add("heavy", Json::Int32(s.heavy)).Add("recent", Json::Int32(s.recent)));
      break;
    case CompressionSpec::Eviction::kExpectedAttention: {
      Json e = Json::Object();
      e.Add("budget", Json::Int32(s.budget))
          .Add("window", Json::Int32(s.window))
          .Add("future_positions", Json::Int32(s.future_positions))
          .Add("skip_value_norm", Json::Bool(s.skip_value_norm))
          .Add("allocation", Json::Enum(AllocationName(s.adaptive)));
      if (s.sinks >= 0) e.Add("sinks", Json::Int32(s.sinks));
      if (s.head_floor_percent >= 0) e.Add("head_floor_percent", Json::Int32(s.head_floor_percent));
      out.Add("expected_attention", std::move(e));
      break;
    }
    case CompressionSpec::Eviction::kNone:
      break;
  }
  out.Add("storage", Json::Enum(StorageFormatProtoName(s.storage)))
      .Add("residual_tokens", Json::Int32(s.residual_tokens));
  return out;
}

Json JsonOf(const client::SequenceInfo& s) {
  Json out = Json::Object();
  out.Add("sequence_id", Json::String(s.sequence_id))
      .Add("pool", Json::String(s.pool))
      .Add("tenant", Json::String(s.tenant))
      .Add("visible_tokens", Json::Int64(s.visible_tokens))
      .Add("layer_tokens", Int64s(s.layer_tokens))
      .Add("stored_token_heads", Json::Int64(s.stored_token_heads))
      .Add("bytes_by_format", FormatBytesJson(s.bytes_by_format))
      .Add("bytes", Json::Int64(s.bytes))
      .Add("compression_ratio", Json::Double(s.compression_ratio));
  if (s.policy.has_value()) out.Add("policy", JsonOf(*s.policy));
  out.Add("created_unix_ms", Json::Int64(s.created_unix_ms))
      .Add("storage", Json::Enum(StorageFormatProtoName(s.storage)))
      .Add("stored_tokens", Int64s(s.stored_tokens))
      .Add("attached_tokens", Json::Int64(s.attached_tokens));
  return out;
}

Json JsonOf(const client::TenantUsage& t) {
  Json out = Json::Object();
  out.Add("tenant", Json::String(t.tenant))
      .Add("sequences", Json::Int64(t.sequences))
      .Add("pool_bytes", Int64Map(t.pool_bytes))
      .Add("open_streams", Json::Int32(t.open_streams))
      .Add("compute_calls", Json::Int32(t.compute_calls))
      .Add("quota_bytes_per_pool", Json::Int64(t.quota_bytes_per_pool))
      .Add("quota_sequences", Json::Int64(t.quota_sequences))
      .Add("quota_streams", Json::Int32(t.quota_streams))
      .Add("quota_compute_calls", Json::Int32(t.quota_compute_calls))
      .Add("lease_only_bytes", Int64Map(t.lease_only_bytes));
  return out;
}

Json JsonOf(const client::LeaseInfo& l) {
  Json out = Json::Object();
  out.Add("lease_id", Json::String(l.lease_id))
      .Add("tenant", Json::String(l.tenant))
      .Add("sequence_id", Json::String(l.sequence_id))
      .Add("pool", Json::String(l.pool))
      .Add("leased_bytes", Json::Int64(l.leased_bytes))
      .Add("lease_only_bytes", Json::Int64(l.lease_only_bytes))
      .Add("granted_unix_ms", Json::Int64(l.granted_unix_ms))
      .Add("expires_unix_ms", Json::Int64(l.expires_unix_ms))
      .Add("renewals", Json::Int64(l.renewals));
  return out;
}

Json JsonOf(const client::ServerInfo& i) {
  Json out = Json::Object();
  out.Add("shard", Json::String(i.shard))
      .Add("incarnation", Json::String(i.incarnation))
      .Add("weight", Json::Double(i.weight))
      .Add("draining", Json::Bool(i.draining))
      .Add("started_unix_ms", Json::Int64(i.started_unix_ms))
      .Add("local_socket", Json::String(i.local_socket))
      .Add("local_token", Json::String(i.local_token))
      .Add("transfer_port", Json::Int32(i.transfer_port))
      .Add("nccl_transfers", Json::String(i.nccl_transfers));
  return out;
}

Json JsonOf(const client::EvictResult& r) {
  Json out = Json::Object();
  out.Add("freed_blocks", Json::Int64(r.freed_blocks))
      .Add("freed_bytes", Json::Int64(r.freed_bytes));
  return out;
}

Json JsonOf(const client::DrainResult& r) {
  Json out = Json::Object();
  out.Add("draining", Json::Bool(r.draining)).Add("sequences", Json::Int64(r.sequences));
  return out;
}

Json JsonOf(const client::SequenceList& list) {
  Json sequences = Json::Array();
  for (const client::SequenceInfo& s : list.sequences) sequences.Push(JsonOf(s));
  Json out = Json::Object();
  out.Add("sequences", std::move(sequences))
      .Add("total", Json::Int64(list.total))
      .Add("next_page_token", Json::String(list.next_page_token));
  return out;
}

Json JsonOf(const std::vector<client::PoolInfo>& pools) {
  Json list = Json::Array();
  for (const client::PoolInfo& p : pools) list.Push(JsonOf(p));
  Json out = Json::Object();
  out.Add("pools", std::move(list));
  return out;
}

Json JsonOf(const std::vector<client::TenantUsage>& tenants) {
  Json list = Json::Array();
  for (const client::TenantUsage& t : tenants) list.Push(JsonOf(t));
  Json out = Json::Object();
  out.Add("tenants", std::move(list));
  return out;
}

Json JsonOf(const std::vector<client::LeaseInfo>& leases) {
  Json list = Json::Array();
  for (const client::LeaseInfo& l : leases) list.Push(JsonOf(l));
  Json out = Json::Object();
  out.Add("leases", std::move(list));
  return out;
}

Json EndLeaseJson(int64_t freed_blocks) {
  Json out = Json::Object();
  out.Add("freed_blocks", Json::Int64(freed_blocks));
  return out;
}

}  // namespace kvc::cli
