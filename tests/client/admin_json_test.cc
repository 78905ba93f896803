// kvcachectl --json (client/cli/admin_json.h) writes the client library's admin types exactly
// as protobuf's JSON printer wrote the kvcache.v1 responses kvcachectl printed before it used
// AdminClient: each response filled, converted to the client type (client/src/convert.h, what
// AdminClient returns) and printed, against MessageToJsonString of the same message.
#include "client/cli/admin_json.h"

#include <string>
#include <vector>

#include "client/src/convert.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "kvcache/v1/admin_service.pb.h"
#include "kvcache/v1/kvcache_service.pb.h"

namespace kvc::cli {
namespace {

namespace pb = ::kvcache::v1;
using client::internal::FromProto;

// kvcachectl's printer before AdminClient (client/cli/print.cc's Json).
std::string ProtoJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(message, &out, options).ok());
  return out;
}

void FillFormats(google::protobuf::RepeatedPtrField<pb::FormatBytes>* out) {
  auto* f = out->Add();
  f->set_format(pb::STORAGE_FORMAT_INT4_G32);
  f->set_blocks(7);
  f->set_bytes(int64_t{1} << 40);
  f = out->Add();
  f->set_format(pb::STORAGE_FORMAT_F16);
  f->set_blocks(3);
  f->set_bytes(12288);
}

pb::SequenceInfo FilledSequence() {
  pb::SequenceInfo s;
  s.set_sequence_id("s-\"quoted\"\\ <id>\n\t");
  s.set_pool("default");
  s.set_tenant("team-a");
  s.set_visible_tokens(100);
  for (int64_t n : {100, 101, 99}) s.add_layer_tokens(n);
  s.set_stored_token_heads(9000);
  FillFormats(s.mutable_bytes_by_format());
  s.set_bytes(2580480);
  s.set_compression_ratio(0.8928571428571429);
  s.set_created_unix_ms(1767225600123);
  s.set_storage(pb::STORAGE_FORMAT_FP8_E4M3);
  for (int64_t n : {5, 6}) s.add_stored_tokens(n);
  s.set_attached_tokens(32);
  return s;
}

pb::PoolStats FilledStats() {
  pb::PoolStats s;
  s.set_pool("small");
  s.set_capacity_bytes(268435456);
  s.set_used_bytes(5160960);
  s.set_free_bytes(263274496);
  s.set_total_blocks(65536);
  s.set_used_blocks(1260);
  s.set_sequences(2);
  s.set_visible_tokens(200);
  s.set_stored_token_heads(18000);
  FillFormats(s.mutable_bytes_by_format());
  s.set_appended_bytes_total(6912000);
  s.set_fetched_bytes_total(-1);
  s.set_dense_bytes(4608000);
  (*s.mutable_evicted_token_heads())["operator"] = 9000;  // one entry: the wire map's order
  s.set_tenant("team-b");
  s.set_quota_bytes(1 << 30);
  s.set_quota_sequences(10);
  pb::PrefixCacheStats* c = s.mutable_prefix_cache();
  c->set_lookups(1);
  c->set_hits(2);
  c->set_lookup_tokens(3);
  c->set_hit_tokens(4);
  c->set_attached_tokens(5);
  c->set_checksum_misses(6);
  c->set_published_entries(7);
  c->set_evicted_entries(8);
  c->set_entries(9);
  c->set_cached_bytes(10);
  c->set_unreferenced_bytes(11);
  c->set_corrupt_reads(12);
  c->set_evicted_misses(13);
  pb::LeaseStats* l = s.mutable_leases();
  l->set_active(1);
  l->set_leased_bytes(2);
  l->set_granted(3);
  l->set_renewed(4);
  l->set_released(5);
  l->set_expired(6);
  l->set_lease_only_bytes(7);
  return s;
}

TEST(AdminJsonTest, PoolStatsAsProtobufPrintsThem) {
  const pb::PoolStats filled = FilledStats();
  EXPECT_EQ(JsonOf(FromProto(filled)).Render(), ProtoJson(filled));
  // Sections the server did not send stay absent; zeros are printed.
  pb::PoolStats bare;
  EXPECT_EQ(JsonOf(FromProto(bare)).Render(), ProtoJson(bare));
  pb::PoolStats tenant_view;
  tenant_view.set_tenant("team-a");
  tenant_view.mutable_leases()->set_lease_only_bytes(4096);
  const client::PoolStats converted = FromProto(tenant_view);
  EXPECT_FALSE(converted.has_prefix_cache);
  EXPECT_TRUE(converted.has_leases);
  EXPECT_EQ(converted.leases.lease_only_bytes, 4096);
  EXPECT_EQ(JsonOf(converted).Render(), ProtoJson(tenant_view));
}

TEST(AdminJsonTest, MapsPrintSortedByKey) {
  pb::PoolStats stats;
  (*stats.mutable_evicted_token_heads())["snapkv"] = 2;
  (*stats.mutable_evicted_token_heads())["h2o"] = 1;
  const std::string json = JsonOf(FromProto(stats)).Render();
  EXPECT_NE(json.find("\"evicted_token_heads\": {\n  \"h2o\": \"1\",\n  \"snapkv\": \"2\"\n }"),
            std::string::npos)
      << json;
}

TEST(AdminJsonTest, PoolsAsProtobufPrintsThem) {
  pb::ListPoolsResponse response;
  EXPECT_EQ(JsonOf(std::vector<client::PoolInfo>{}).Render(), ProtoJson(response));
  for (pb::DType dtype : {pb::DTYPE_F32, pb::DTYPE_F16, pb::DTYPE_BF16}) {
    pb::PoolInfo* p = response.add_pools();
    p->set_name("default");
    p->set_device("cuda:0");
    pb::PoolGeometry* g = p->mutable_geometry();
    g->set_num_layers(30);
    g->set_num_kv_heads(3);
    g->set_num_query_heads(9);
    g->set_head_dim(64);
    g->set_block_tokens(16);
    g->set_dtype(dtype);
    if (dtype != pb::DTYPE_F32) {
      g->mutable_rope()->set_theta(dtype == pb::DTYPE_F16 ? 100000 : 10000.5);
      g->mutable_rope()->set_rotary_dim(32);
      g->mutable_rope()->set_style(dtype == pb::DTYPE_F16 ? pb::ROPE_STYLE_NEOX
                                                          : pb::ROPE_STYLE_GPTJ);
    }
    p->set_capacity_bytes(268435456);
    p->set_block_bytes(4096);
    p->set_total_blocks(65536);
    p->set_free_blocks(64276);
    p->set_used_bytes(5160960);
    p->set_sequences(2);
  }
  std::vector<client::PoolInfo> pools;
  for (const pb::PoolInfo& p : response.pools()) pools.push_back(FromProto(p));
  EXPECT_EQ(JsonOf(pools).Render(), ProtoJson(response));
}

TEST(AdminJsonTest, SequencesAsProtobufPrintSequences) {
  pb::ListSequencesResponse response;
  EXPECT_EQ(JsonOf(client::SequenceList{}).Render(), ProtoJson(response));
  *response.add_sequences() = FilledSequence();
  response.add_sequences();  // all zeros
  response.set_total(12);
  response.set_next_page_token("next/page=");
  client::SequenceList list;
  for (const pb::SequenceInfo& s : response.sequences()) list.sequences.push_back(FromProto(s));
  list.total = response.total();
  list.next_page_token = response.next_page_token();
  EXPECT_EQ(JsonOf(list).Render(), ProtoJson(response));
}

TEST(AdminJsonTest, EveryStorageFormatByItsProtoName) {
  for (int f = 0; f < pb::StorageFormat_ARRAYSIZE; ++f) {
    pb::SequenceInfo s;
    s.set_storage(static_cast<pb::StorageFormat>(f));
    s.add_bytes_by_format()->set_format(static_cast<pb::StorageFormat>(f));
    EXPECT_EQ(JsonOf(FromProto(s)).Render(), ProtoJson(s)) << f;
  }
}

TEST(AdminJsonTest, PoliciesAsProtobufPrintsThem) {
  std::vector<pb::CompressionSpec> specs(7);
  specs[1].mutable_streaming_llm()->set_sinks(4);
  specs[1].mutable_streaming_llm()->set_window(1020);
  specs[1].mutable_streaming_llm()->set_rerotate_keys(true);
  specs[1].set_storage(pb::STORAGE_FORMAT_INT8);
  specs[1].set_residual_tokens(64);
  for (int i : {2, 3}) {
    pb::SnapKvSpec* k = specs[i].mutable_snapkv();
    k->set_window(32);
    k->set_budget(512);
    k->set_pooling_kernel(13);
    k->set_pooling(i == 2 ? pb::SnapKvSpec::POOLING_MAX : pb::SnapKvSpec::POOLING_AVG);
    k->set_allocation(i == 2 ? pb::SnapKvSpec::ALLOCATION_UNIFORM
                             : pb::SnapKvSpec::ALLOCATION_ADAPTIVE);
    if (i == 3) k->set_head_floor_percent(20);
    k->set_pyramid_beta(20);
  }
  specs[4].mutable_h2o()->set_heavy(100);
  specs[4].mutable_h2o()->set_recent(28);
  for (int i : {5, 6}) {
    pb::ExpectedAttentionSpec* e = specs[i].mutable_expected_attention();
    e->set_budget(256);
    e->set_window(16);
    if (i == 6) e->set_sinks(0);
    e->set_future_positions(512);
    e->set_skip_value_norm(i == 5);
    e->set_allocation(i == 5 ? pb::SnapKvSpec::ALLOCATION_UNIFORM
                             : pb::SnapKvSpec::ALLOCATION_ADAPTIVE);
    if (i == 6) e->set_head_floor_percent(0);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    pb::SequenceInfo s = FilledSequence();
    *s.mutable_policy() = specs[i];
    EXPECT_EQ(JsonOf(FromProto(s)).Render(), ProtoJson(s)) << i;
  }
}

TEST(AdminJsonTest, TenantsLeasesAndTheSmallAnswersAsProtobufPrintsThem) {
  pb::ListTenantsResponse tenants;
  EXPECT_EQ(JsonOf(std::vector<client::TenantUsage>{}).Render(), ProtoJson(tenants));
  pb::TenantUsage* t = tenants.add_tenants();
  t->set_tenant("ctl-test");
  t->set_sequences(2);
  (*t->mutable_pool_bytes())["default"] = 5160960;
  t->set_open_streams(1);
  t->set_compute_calls(2);
  t->set_quota_bytes_per_pool(3);
  t->set_quota_sequences(4);
  t->set_quota_streams(5);
  t->set_quota_compute_calls(6);
  (*t->mutable_lease_only_bytes())["default"] = 4096;
  tenants.add_tenants();
  std::vector<client::TenantUsage> usage;
  for (const pb::TenantUsage& u : tenants.tenants()) usage.push_back(FromProto(u));
  EXPECT_EQ(JsonOf(usage).Render(), ProtoJson(tenants));

  pb::ListLeasesResponse leases;
  EXPECT_EQ(JsonOf(std::vector<client::LeaseInfo>{}).Render(), ProtoJson(leases));
  pb::LeaseInfo* l = leases.add_leases();
  l->set_lease_id("lease-1");
  l->set_tenant("team-a");
  l->set_sequence_id("s-1");
  l->set_pool("default");
  l->set_leased_bytes(8192);
  l->set_lease_only_bytes(4096);
  l->set_granted_unix_ms(1767225600000);
  l->set_expires_unix_ms(1767225630000);
  l->set_renewals(3);
  leases.add_leases();
  std::vector<client::LeaseInfo> infos;
  for (const pb::LeaseInfo& i : leases.leases()) infos.push_back(FromProto(i));
  EXPECT_EQ(JsonOf(infos).Render(), ProtoJson(leases));

  pb::EvictSequenceResponse evicted;
  evicted.set_freed_blocks(630);
  evicted.set_freed_bytes(2580480);
  EXPECT_EQ(JsonOf(client::EvictResult{630, 2580480}).Render(), ProtoJson(evicted));
  pb::EndLeaseResponse ended;
  ended.set_freed_blocks(5);
  EXPECT_EQ(EndLeaseJson(5).Render(), ProtoJson(ended));
  pb::DrainResponse drained;
  EXPECT_EQ(JsonOf(client::DrainResult{}).Render(), ProtoJson(drained));
  drained.set_draining(true);
  drained.set_sequences(2);
  EXPECT_EQ(JsonOf(client::DrainResult{true, 2}).Render(), ProtoJson(drained));

  pb::ServerInfo info;
  info.set_shard("shard-a");
  info.set_incarnation("0a1b2c3d");
  info.set_weight(2.5);
  info.set_draining(true);
  info.set_started_unix_ms(1767225600000);
  info.set_local_socket("/run/kvcached.sock");
  info.set_local_token("token");
  info.set_transfer_port(50052);
  info.set_nccl_transfers("NCCL 2.28.9 (libnccl.so.2)");
  EXPECT_EQ(JsonOf(FromProto(info)).Render(), ProtoJson(info));
}

TEST(AdminJsonTest, DoublesAsProtobufPrintsThem) {
  for (double v : {0.0, 1.0, 0.1, 1.0 / 3, 1e21, 1e-7, 123456789.125, -2.5}) {
    pb::SequenceInfo s;
    s.set_compression_ratio(v);
    EXPECT_EQ(JsonOf(FromProto(s)).Render(), ProtoJson(s)) << v;
  }
}

}  // namespace
}  // namespace kvc::cli
