#include "client/src/convert.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kvc/kernels/dtype.h"

namespace kvc::client {

// The public enums are kvc/kernels/dtype.h's rows with their wire numbers (kPoolDefault = the
// proto's 0): checked here, so the client, the proto and the kernels cannot drift apart.
namespace pb = ::kvcache::v1;
#define KVC_CHECK(Type, Wire, e, w, p)                                                     \
  static_assert(static_cast<int>(Type::e) == w, #Type "::" #e " is not dtype.h's number"); \
  static_assert(pb::Wire##_##p == w, #Wire "_" #p " is not dtype.h's number");
#define KVC_CHECK_DTYPE(e, k, w, p, n) KVC_CHECK(DType, DTYPE, e, w, p)
#define KVC_CHECK_FORMAT(e, k, w, p, n) KVC_CHECK(StorageFormat, STORAGE_FORMAT, e, w, p)
KVC_DTYPES(KVC_CHECK_DTYPE)
KVC_STORAGE_FORMATS(KVC_CHECK_FORMAT)
static_assert(pb::DType_ARRAYSIZE == kernels::kNumDTypes + 1);
static_assert(pb::StorageFormat_ARRAYSIZE == kernels::kNumStorageFormats + 1);
#undef KVC_CHECK_FORMAT
#undef KVC_CHECK_DTYPE
#undef KVC_CHECK

#define KVC_NAME_CASE(Type, e, n) \
  case Type::e:                   \
    return n;
#define KVC_DTYPE_NAME(e, k, w, p, n) KVC_NAME_CASE(DType, e, n)
#define KVC_FORMAT_NAME(e, k, w, p, n) KVC_NAME_CASE(StorageFormat, e, n)

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kPoolDefault:
      return "pool-default";
      KVC_DTYPES(KVC_DTYPE_NAME)
  }
  return "?";
}

const char* StorageFormatName(StorageFormat format) {
  switch (format) {
    case StorageFormat::kPoolDefault:
      return "pool-default";
      KVC_STORAGE_FORMATS(KVC_FORMAT_NAME)
  }
  return "?";
}

#undef KVC_FORMAT_NAME
#undef KVC_DTYPE_NAME
#undef KVC_NAME_CASE

namespace internal {

// The public enums use the proto's numbers, so conversion is a checked cast.
pb::DType ToProto(DType dtype) { return static_cast<pb::DType>(dtype); }

DType FromProto(pb::DType dtype) {
  return pb::DType_IsValid(dtype) ? static_cast<DType>(dtype) : DType::kPoolDefault;
}

StorageFormat FromProto(pb::StorageFormat format) {
  return pb::StorageFormat_IsValid(format) ? static_cast<StorageFormat>(format)
                                           : StorageFormat::kPoolDefault;
}

namespace {

std::vector<FormatBytes> FromProto(
    const google::protobuf::RepeatedPtrField<pb::FormatBytes>& list) {
  std::vector<FormatBytes> out;
  for (const auto& fb : list)
    out.push_back({internal::FromProto(fb.format()), fb.blocks(), fb.bytes()});
  return out;
}

// A proto map<string, int64> as (key, value) pairs sorted by key: the wire map's order is
// a hash table's.
std::vector<std::pair<std::string, int64_t>> SortedPairs(
    const google::protobuf::Map<std::string, int64_t>& map) {
  std::vector<std::pair<std::string, int64_t>> out(map.begin(), map.end());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

SequenceInfo FromProto(const pb::SequenceInfo& in) {
  SequenceInfo s;
  s.sequence_id = in.sequence_id();
  s.pool = in.pool();
  s.tenant = in.tenant();
  s.visible_tokens = in.visible_tokens();
  s.layer_tokens.assign(in.layer_tokens().begin(), in.layer_tokens().end());
  s.stored_token_heads = in.stored_token_heads();
  s.bytes_by_format = FromProto(in.bytes_by_format());
  s.bytes = in.bytes();
  s.compression_ratio = in.compression_ratio();
  s.created_unix_ms = in.created_unix_ms();
  s.storage = FromProto(in.storage());
  s.stored_tokens.assign(in.stored_tokens().begin(), in.stored_tokens().end());
  s.attached_tokens = in.attached_tokens();
  if (in.has_policy()) s.policy = FromProto(in.policy());
  return s;
}

CompressionSpec FromProto(const pb::CompressionSpec& in) {
  CompressionSpec s;
  switch (in.eviction_case()) {
    case pb::CompressionSpec::kStreamingLlm:
      s.eviction = CompressionSpec::Eviction::kStreamingLlm;
      s.sinks = in.streaming_llm().sinks();
      s.window = in.streaming_llm().window();
      s.rerotate_keys = in.streaming_llm().rerotate_keys();
      break;
    case pb::CompressionSpec::kSnapkv: {
      const pb::SnapKvSpec& k = in.snapkv();
      s.eviction = CompressionSpec::Eviction::kSnapKv;
      s.window = k.window();
      s.budget = k.budget();
      s.pooling_kernel = k.pooling_kernel();
      s.pooling_avg = k.pooling() == pb::SnapKvSpec::POOLING_AVG;
      s.adaptive = k.allocation() == pb::SnapKvSpec::ALLOCATION_ADAPTIVE;
      s.head_floor_percent = k.has_head_floor_percent() ? k.head_floor_percent() : -1;
      s.pyramid_beta = k.pyramid_beta();
      break;
    }
    case pb::CompressionSpec::kH2O:
      s.eviction = CompressionSpec::Eviction::kH2o;
      s.heavy = in.h2o().heavy();
      s.recent = in.h2o().recent();
      break;
    case pb::CompressionSpec::kExpectedAttention: {
      const pb::ExpectedAttentionSpec& e = in.expected_attention();
      s.eviction = CompressionSpec::Eviction::kExpectedAttention;
      s.budget = e.budget();
      s.window = e.window();
      s.sinks = e.has_sinks() ? e.sinks() : -1;
      s.future_positions = e.future_positions();
      s.skip_value_norm = e.skip_value_norm();
      s.adaptive = e.allocation() == pb::SnapKvSpec::ALLOCATION_ADAPTIVE;
      s.head_floor_percent = e.has_head_floor_percent() ? e.head_floor_percent() : -1;
      break;
    }
    case pb::CompressionSpec::EVICTION_NOT_SET:
      break;
  }
  s.storage = FromProto(in.storage());
  s.residual_tokens = in.residual_tokens();
  return s;
}

void ToProto(const Prefix& prefix, pb::PrefixSpec* out) {
  out->set_model(prefix.model);
  out->set_salt(prefix.salt);
  out->mutable_token_ids()->Assign(prefix.token_ids.begin(), prefix.token_ids.end());
}

PoolInfo FromProto(const pb::PoolInfo& in) {
  PoolInfo p;
  p.name = in.name();
  p.device = in.device();
  const pb::PoolGeometry& g = in.geometry();
  p.geometry.num_layers = g.num_layers();
  p.geometry.num_kv_heads = g.num_kv_heads();
  p.geometry.num_query_heads = g.num_query_heads();
  p.geometry.head_dim = g.head_dim();
  p.geometry.block_tokens = g.block_tokens();
  p.geometry.dtype = FromProto(g.dtype());
  if (g.has_rope()) {
    p.geometry.rope.enabled = true;
    p.geometry.rope.theta = g.rope().theta();
    p.geometry.rope.rotary_dim = g.rope().rotary_dim();
    p.geometry.rope.gptj_style = g.rope().style() == pb::ROPE_STYLE_GPTJ;
  }
  p.capacity_bytes = in.capacity_bytes();
  p.block_bytes = in.block_bytes();
  p.total_blocks = in.total_blocks();
  p.free_blocks = in.free_blocks();
  p.used_bytes = in.used_bytes();
  p.sequences = in.sequences();
  return p;
}

PoolStats FromProto(const pb::PoolStats& in) {
  PoolStats s;
  s.pool = in.pool();
  s.capacity_bytes = in.capacity_bytes();
  s.used_bytes = in.used_bytes();
  s.free_bytes = in.free_bytes();
  s.total_blocks = in.total_blocks();
  s.used_blocks = in.used_blocks();
  s.sequences = in.sequences();
  s.visible_tokens = in.visible_tokens();
  s.stored_token_heads = in.stored_token_heads();
  s.bytes_by_format = FromProto(in.bytes_by_format());
  s.appended_bytes_total = in.appended_bytes_total();
  s.fetched_bytes_total = in.fetched_bytes_total();
  s.dense_bytes = in.dense_bytes();
  s.evicted_token_heads = SortedPairs(in.evicted_token_heads());
  s.tenant = in.tenant();
  s.quota_bytes = in.quota_bytes();
  s.quota_sequences = in.quota_sequences();
  s.has_prefix_cache = in.has_prefix_cache();
  const pb::PrefixCacheStats& c = in.prefix_cache();
  s.prefix_cache = {c.lookups(),
                    c.hits(),
                    c.lookup_tokens(),
                    c.hit_tokens(),
                    c.attached_tokens(),
                    c.checksum_misses(),
                    c.published_entries(),
                    c.evicted_entries(),
                    c.entries(),
                    c.cached_bytes(),
                    c.unreferenced_bytes(),
                    c.corrupt_reads(),
                    c.evicted_misses()};
  const pb::LeaseStats& l = in.leases();
  s.has_leases = in.has_leases();
  s.leases = {l.active(),   l.leased_bytes(), l.granted(),         l.renewed(),
              l.released(), l.expired(),      l.lease_only_bytes()};
  return s;
}

ServerInfo FromProto(const pb::ServerInfo& in) {
  return ServerInfo{in.shard(),       in.incarnation(),     in.weight(),
                    in.draining(),    in.started_unix_ms(), in.local_socket(),
                    in.local_token(), in.transfer_port(),   in.nccl_transfers()};
}

TenantUsage FromProto(const pb::TenantUsage& in) {
  TenantUsage u;
  u.tenant = in.tenant();
  u.sequences = in.sequences();
  u.pool_bytes = SortedPairs(in.pool_bytes());
  u.open_streams = in.open_streams();
  u.compute_calls = in.compute_calls();
  u.quota_bytes_per_pool = in.quota_bytes_per_pool();
  u.quota_sequences = in.quota_sequences();
  u.quota_streams = in.quota_streams();
  u.quota_compute_calls = in.quota_compute_calls();
  u.lease_only_bytes = SortedPairs(in.lease_only_bytes());
  return u;
}

LeaseInfo FromProto(const pb::LeaseInfo& in) {
  return LeaseInfo{
      in.lease_id(),     in.tenant(),           in.sequence_id(),     in.pool(),
      in.leased_bytes(), in.lease_only_bytes(), in.granted_unix_ms(), in.expires_unix_ms(),
      in.renewals()};
}

absl::StatusOr<Lease> FromProto(const pb::Lease& in) {
  Lease l;
  l.lease_id = in.lease_id();
  l.sequence_id = in.sequence_id();
  l.pool = in.pool();
  l.device = in.device();
  l.ttl_ms = in.ttl_ms();
  l.expires_unix_ms = in.expires_unix_ms();
  l.block_tokens = in.block_tokens();
  l.head_dim = in.head_dim();
  l.dtype = FromProto(in.dtype());
  for (const pb::LeaseArena& a : in.arenas()) {
    LeaseArena arena{FromProto(a.format()), a.block_bytes(),  a.record_bytes(),
                     a.key_offset(),        a.value_offset(), {}};
    for (const pb::LeaseArenaSegment& s : a.segments()) {
      arena.segments.push_back({s.index(), s.epoch()});
    }
    l.arenas.push_back(std::move(arena));
  }
  l.layers.assign(in.layers().begin(), in.layers().end());
  l.layer_generations.assign(in.layer_generations().begin(), in.layer_generations().end());
  l.layer_tokens.assign(in.layer_tokens().begin(), in.layer_tokens().end());
  l.local_token = in.local_token();
  l.visible_tokens = in.visible_tokens();
  l.leased_bytes = in.leased_bytes();
  for (const pb::LeaseLane& lane : in.lanes()) {
    LeaseLane out{lane.layer(), lane.kv_head(), {}};
    for (const pb::LeaseSegment& seg : lane.segments()) {
      LeaseSegment s{FromProto(seg.format()), {seg.blocks().begin(), seg.blocks().end()}, {}};
      const auto& runs = seg.position_runs();
      if (runs.size() % 2 != 0) return absl::InternalError("odd position_runs in a lease");
      for (int i = 0; i < runs.size(); i += 2) {
        const int32_t first = runs[i];
        const int32_t count = runs[i + 1];
        const int64_t room = static_cast<int64_t>(seg.blocks_size()) * in.block_tokens();
        if (count <= 0 || first > std::numeric_limits<int32_t>::max() - count ||
            static_cast<int64_t>(s.positions.size()) + count > room) {
          return absl::InternalError("a lease's position run is out of range");
        }
        for (int32_t j = 0; j < count; ++j) s.positions.push_back(first + j);
      }
      out.segments.push_back(std::move(s));
    }
    l.lanes.push_back(std::move(out));
  }
  return l;
}

void ToProto(const AppendChunk& c, pb::AppendRequest* out) {
  out->set_sequence_id(c.sequence_id);
  out->set_layer(c.layer);
  out->set_start_position(c.start_position);
  out->set_num_tokens(c.num_tokens);
  out->set_dtype(ToProto(c.dtype));
  // A null pointer with zero bytes is a valid empty payload.
  out->set_keys(c.keys != nullptr ? static_cast<const char*>(c.keys) : "", c.keys ? c.bytes : 0);
  out->set_values(c.values != nullptr ? static_cast<const char*>(c.values) : "",
                  c.values ? c.bytes : 0);
}

void ToProto(const CompressionSpec& s, pb::CompressionSpec* out) {
  switch (s.eviction) {
    case CompressionSpec::Eviction::kStreamingLlm:
      out->mutable_streaming_llm()->set_sinks(s.sinks);
      out->mutable_streaming_llm()->set_window(s.window);
      out->mutable_streaming_llm()->set_rerotate_keys(s.rerotate_keys);
      break;
    case CompressionSpec::Eviction::kSnapKv:
      out->mutable_snapkv()->set_window(s.window);
      out->mutable_snapkv()->set_budget(s.budget);
      out->mutable_snapkv()->set_pooling_kernel(s.pooling_kernel);
      out->mutable_snapkv()->set_pooling(s.pooling_avg ? pb::SnapKvSpec::POOLING_AVG
                                                       : pb::SnapKvSpec::POOLING_MAX);
      out->mutable_snapkv()->set_allocation(s.adaptive ? pb::SnapKvSpec::ALLOCATION_ADAPTIVE
                                                       : pb::SnapKvSpec::ALLOCATION_UNIFORM);
      if (s.head_floor_percent >= 0) {
        out->mutable_snapkv()->set_head_floor_percent(s.head_floor_percent);
      }
      out->mutable_snapkv()->set_pyramid_beta(s.pyramid_beta);
      break;
    case CompressionSpec::Eviction::kExpectedAttention: {
      auto* e = out->mutable_expected_attention();
      e->set_budget(s.budget);
      e->set_window(s.window);
      if (s.sinks >= 0) e->set_sinks(s.sinks);
      e->set_future_positions(s.future_positions);
      e->set_skip_value_norm(s.skip_value_norm);
      e->set_allocation(s.adaptive ? pb::SnapKvSpec::ALLOCATION_ADAPTIVE
                                   : pb::SnapKvSpec::ALLOCATION_UNIFORM);
      if (s.head_floor_percent >= 0) e->set_head_floor_percent(s.head_floor_percent);
      break;
    }
    case CompressionSpec::Eviction::kH2o:
      out->mutable_h2o()->set_heavy(s.heavy);
      out->mutable_h2o()->set_recent(s.recent);
      break;
    case CompressionSpec::Eviction::kNone:
      break;
  }
  out->set_storage(static_cast<pb::StorageFormat>(s.storage));
  out->set_residual_tokens(s.residual_tokens);
}

void ToProto(const AttendRequest& r, pb::AttendRequest* out) {
  out->set_sequence_id(r.sequence_id);
  out->set_layer(r.layer);
  out->set_dtype(ToProto(r.dtype));
  out->set_queries(r.queries != nullptr ? static_cast<const char*>(r.queries) : "",
                   r.queries != nullptr ? r.bytes : 0);
  out->mutable_positions()->Add(r.positions.begin(), r.positions.end());
  out->set_return_weights(r.return_weights);
}

AttendResult FromProto(pb::AttendResponse& in) {
  AttendResult r;
  r.output = std::move(*in.mutable_output());
  r.dtype = FromProto(in.dtype());
  r.max_stored = in.max_stored();
  r.weights.assign(in.weights().begin(), in.weights().end());
  r.weight_positions.assign(in.weight_positions().begin(), in.weight_positions().end());
  return r;
}

CompressResult FromProto(const pb::CompressResponse& in) {
  CompressResult r;
  for (const auto& l : in.layers()) {
    r.layers.push_back({l.layer(), l.token_heads_before(), l.token_heads_after(), l.bytes_before(),
                        l.bytes_after()});
  }
  r.bytes_before = in.bytes_before();
  r.bytes_after = in.bytes_after();
  r.storage = FromProto(in.storage());
  r.sequence = FromProto(in.sequence());
  return r;
}

FetchedChunk FromProto(pb::FetchChunk& in) {
  FetchedChunk c;
  c.layer = in.layer();
  c.kv_head = in.kv_head();
  c.first_index = in.first_index();
  c.num_tokens = in.num_tokens();
  c.positions.assign(in.positions().begin(), in.positions().end());
  c.keys = std::move(*in.mutable_keys());
  c.values = std::move(*in.mutable_values());
  c.dtype = FromProto(in.dtype());
  c.storage = FromProto(in.storage());
  c.record_bytes = in.record_bytes();
  c.visible_tokens = in.visible_tokens();
  return c;
}

}  // namespace internal
}  // namespace kvc::client
