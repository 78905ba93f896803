// Leases through the store: a lease describes exactly what Fetch serves, read straight from
// the pool's arena the way a same-node reader maps it; nothing it describes changes while it
// lives, whatever the sequence goes through (append, eviction, compaction, format conversion,
// Release) and also while those run concurrently with the reads; the leased blocks return to
// the pool when the lease is released or its TTL passes (the reaper, no call needed), and
// blocks thaw so the sequence writes in place again; refusals change nothing.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "cachesvc/core/store/kv_store.h"
#include "cachesvc/transport/lease_sender.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/cachesvc/compression_fixture.h"
#include "tests/cachesvc/stored_dump.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::StatusIs;

constexpr int kTokens = 100;  // 6 whole blocks of 16 + 4 per lane
constexpr int64_t kLanes = 4;

// What a same-node reader sees: every leased record read from the pool's host arena at the
// offsets the lease gives, in the shape of stored_dump.h's Read (per lane, "position:K V").
Dump ReadLease(KvStore& store, const LeaseSnapshot& lease) {
  BlockPool* pool = *store.leases().FindPool(lease.pool);
  std::map<std::pair<int, int>, std::string> lanes;
  for (const LeasedLane& lane : lease.lanes) {
    std::string& s = lanes[{lane.layer, lane.kv_head}];
    for (const LeasedSegment& seg : lane.segments) {
      const kernels::BlockLayout* layout = nullptr;
      for (const kernels::BlockLayout& l : lease.layouts) {
        if (l.format == seg.format) layout = &l;
      }
      EXPECT_NE(layout, nullptr) << "no arena described for a segment's format";
      if (layout == nullptr) continue;
      const auto* base = static_cast<const char*>(pool->arena(seg.format).base);
      for (size_t i = 0; i < seg.positions.size(); ++i) {
        const char* block =
            base + static_cast<size_t>(seg.blocks[i / static_cast<size_t>(lease.block_tokens)]) *
                       layout->block_bytes;
        const size_t slot = i % static_cast<size_t>(lease.block_tokens);
        absl::StrAppend(
            &s, seg.positions[i], ":",
            absl::string_view(block + layout->key_offset + slot * layout->record_bytes,
                              layout->record_bytes),
            absl::string_view(block + layout->value_offset + slot * layout->record_bytes,
                              layout->record_bytes));
      }
    }
  }
  Dump d;
  for (auto& [lane, records] : lanes) d.chunks.push_back(std::move(records));
  return d;
}

// Host pools: the test reads the arena's bytes directly, as a mapped reader would.
KvStoreOptions HostOptions(int64_t max_ttl_ms = 300000, int64_t max_per_scope = 256) {
  KvStoreOptions o = Options(Geometry{});
  o.pools[0].device = "cpu";
  o.leases.max_ttl_ms = max_ttl_ms;
  o.leases.max_per_scope = max_per_scope;
  return o;
}

class LeaseTest : public ::testing::Test {
 protected:
  void SetUp() override { Reset(HostOptions()); }
  void Reset(const KvStoreOptions& options) {
    auto created = KvStore::Create(options);
    ASSERT_TRUE(created.ok()) << created.status();
    store_ = std::move(*created);
    id_ = NewSequence(kTokens);
  }
  std::string NewSequence(int tokens, const CompressionSpec& policy = {}) {
    auto seq = store_->CreateSequence(CreateSequenceParams{TenantScope(), "", "", "", policy, {}});
    EXPECT_TRUE(seq.ok()) << seq.status();
    if (!seq.ok()) return "";
    EXPECT_TRUE(AppendTokens(seq->id, 0, tokens).ok());
    return seq->id;
  }
  absl::Status AppendTokens(const std::string& id, int64_t start, int64_t n) {
    for (int l = 0; l < 2; ++l) {
      const std::vector<float> k =
          Gaussian(static_cast<size_t>(n * 2 * 64), 1000 * l + static_cast<uint32_t>(start));
      const std::vector<float> v = Gaussian(k.size(), 7 + 1000 * l + static_cast<uint32_t>(start));
      AppendParams a;
      a.sequence_id = id;
      a.layer = l;
      a.start_position = start;
      a.num_tokens = n;
      a.dtype = DType::kF32;
      a.keys = Bytes(k);
      a.values = Bytes(v);
      KVC_RETURN_IF_ERROR(store_->Append(a).status());
    }
    return absl::OkStatus();
  }
  absl::StatusOr<LeaseSnapshot> Lease(const std::string& id, std::vector<int32_t> layers = {},
                                      int64_t ttl_ms = 0, const std::string& scope = "") {
    return store_->leases().LeaseSequence(
        LeaseParams{TenantScope(scope), id, std::move(layers), ttl_ms});
  }
  int64_t Used() { return store_->stats().ListPools()[0].used_bytes; }
  LeaseStats Stats() { return *store_->stats().LeaseStatsFor(""); }
  BlockPool* Pool() { return *store_->leases().FindPool(""); }

  std::unique_ptr<KvStore> store_;
  std::string id_;
};

TEST_F(LeaseTest, DescribesExactlyWhatFetchServes) {
  const int64_t used = Used();
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id_));
  EXPECT_EQ(Used(), used) << "a lease copies nothing";
  EXPECT_EQ(lease.lease_id.substr(0, 2), "l-");
  EXPECT_EQ(lease.sequence_id, id_);
  EXPECT_EQ(lease.device, "cpu");
  EXPECT_EQ(lease.ttl_ms, 30000) << "the default TTL";
  EXPECT_GT(lease.expires_unix_ms, NowUnixMs() + 25000);
  EXPECT_EQ(lease.block_tokens, 16);
  EXPECT_EQ(lease.head_dim, 64);
  EXPECT_EQ(lease.layers, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(lease.layer_tokens, (std::vector<int64_t>{kTokens, kTokens}));
  EXPECT_EQ(lease.visible_tokens, kTokens);
  ASSERT_EQ(lease.lanes.size(), static_cast<size_t>(kLanes));
  EXPECT_EQ(lease.leased_bytes, store_->GetSequence(id_)->bytes);
  ASSERT_EQ(lease.layouts.size(), 1u);
  EXPECT_EQ(lease.layouts[0].format, StorageFormat::kF32);
  EXPECT_EQ(ReadLease(*store_, lease), Read(*store_, id_));
  const LeaseStats s = Stats();
  EXPECT_EQ(s.active, 1);
  EXPECT_EQ(s.granted, 1);
  EXPECT_EQ(s.leased_bytes, lease.leased_bytes);

  // Some layers only; generations are the layers' own.
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot one, Lease(id_, {1}));
  ASSERT_EQ(one.lanes.size(), 2u);
  EXPECT_EQ(one.lanes[0].layer, 1);
  EXPECT_EQ(one.lanes[1].kv_head, 1);
  EXPECT_EQ(one.layer_generations, std::vector<uint64_t>{lease.layer_generations[1]});
  EXPECT_EQ(one.leased_bytes, lease.leased_bytes / 2);
}

// Every kind of mutation, then Release of the sequence: the leased records stay exactly as
// they were, and the blocks only the lease still holds go back when it ends.
// Ids are capabilities' names: a tenant that saw some must learn nothing of the others. Each
// is 128 random bits, so consecutive ids differ in about half their bits, never in the few a
// counter (or a counter behind an invertible mix, which an earlier version used) would change.
TEST_F(LeaseTest, ServerMadeIdsAre128IndependentBits) {
  std::vector<std::string> ids;
  for (int i = 0; i < 64; ++i) {
    KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot seq,
                             store_->CreateSequence(CreateSequenceParams{
                                 TenantScope(i % 2 == 0 ? "a" : "b"), "", "", "", {}, {}}));
    ids.push_back(seq.id);
    KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id_));
    ids.push_back(lease.lease_id);
  }
  std::set<std::string> distinct;
  std::vector<std::array<uint8_t, 16>> bits;
  for (const std::string& id : ids) {
    ASSERT_EQ(id.size(), 34u) << id;
    ASSERT_TRUE(id.substr(0, 2) == "s-" || id.substr(0, 2) == "l-") << id;
    const std::string raw = absl::HexStringToBytes(id.substr(2));
    ASSERT_EQ(raw.size(), 16u);
    std::array<uint8_t, 16> b{};
    std::memcpy(b.data(), raw.data(), 16);
    bits.push_back(b);
    distinct.insert(id);
  }
  EXPECT_EQ(distinct.size(), ids.size());
  int64_t differing = 0;
  for (size_t i = 1; i < bits.size(); ++i) {
    for (size_t j = 0; j < 16; ++j) differing += __builtin_popcount(bits[i][j] ^ bits[i - 1][j]);
  }
  const double mean = static_cast<double>(differing) / static_cast<double>(bits.size() - 1);
  EXPECT_GT(mean, 54.0) << "consecutive ids share structure";
  EXPECT_LT(mean, 74.0) << "consecutive ids share structure";
}

TEST_F(LeaseTest, NothingLeasedChangesUntilTheLeaseEnds) {
  const Dump before = Read(*store_, id_);
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id_));
  KVC_ASSERT_OK(AppendTokens(id_, kTokens, 20));  // into the leased partial blocks' free slots
  EXPECT_EQ(ReadLease(*store_, lease), before);
  KVC_ASSERT_OK(Mutate(*store_, id_, Streaming(4, 40)));  // evicts, compacts, re-rotates
  EXPECT_EQ(ReadLease(*store_, lease), before);
  KVC_ASSERT_OK(Mutate(*store_, id_, Int4()));  // format conversion
  EXPECT_EQ(ReadLease(*store_, lease), before);
  EXPECT_NE(Read(*store_, id_), before);
  {
    KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot now, Lease(id_));
    EXPECT_GT(now.layer_generations[0], lease.layer_generations[0]) << "tokens moved since";
    KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope(), now.lease_id));
  }
  KVC_ASSERT_OK(store_->Release(id_));
  EXPECT_EQ(ReadLease(*store_, lease), before) << "Release leaves leased blocks to the lease";
  EXPECT_EQ(Used(), lease.leased_bytes) << "only the leased blocks stay";
  KVC_ASSERT_OK_AND_ASSIGN(const int64_t freed,
                           store_->leases().ReleaseLease(TenantScope(), lease.lease_id));
  EXPECT_EQ(freed, 7 * kLanes) << "7 blocks per lane, none held by the sequence any more";
  EXPECT_EQ(Used(), 0);
  EXPECT_EQ(Pool()->shares().frozen_blocks(), 0);
  EXPECT_EQ(Stats().released, 2) << "this lease and the one that read the generations";
  EXPECT_EQ(Stats().active, 0);
  EXPECT_EQ(Stats().leased_bytes, 0);
}

// A sequence with a raw residual window: two segments per lane, each described.
TEST_F(LeaseTest, ResidualTiersAreDescribedPerSegment) {
  CompressionSpec policy = Int4();
  policy.residual_tokens = 32;
  const std::string id = NewSequence(kTokens, policy);
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id));
  ASSERT_EQ(lease.lanes[0].segments.size(), 2u);
  EXPECT_EQ(lease.lanes[0].segments[0].format, StorageFormat::kInt4G32);
  EXPECT_EQ(lease.lanes[0].segments[1].format, StorageFormat::kF32);
  EXPECT_EQ(lease.lanes[0].segments[1].positions.size(), 32u);
  EXPECT_EQ(lease.layouts.size(), 2u);
  const Dump before = Read(*store_, id);
  EXPECT_EQ(ReadLease(*store_, lease), before);
  KVC_ASSERT_OK(AppendTokens(id, kTokens, 40));  // ages residual tokens into INT4
  EXPECT_EQ(ReadLease(*store_, lease), before);
  KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope(), lease.lease_id));
}

// After the lease ends the sequence's blocks are its own again: no copy-on-write is left.
TEST_F(LeaseTest, BlocksThawWhenTheLeaseEnds) {
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id_));
  EXPECT_EQ(Pool()->shares().frozen_blocks(), 7 * kLanes);
  KVC_ASSERT_OK_AND_ASSIGN(const int64_t freed,
                           store_->leases().ReleaseLease(TenantScope(), lease.lease_id));
  EXPECT_EQ(freed, 0) << "the sequence still holds every block";
  EXPECT_EQ(Pool()->shares().frozen_blocks(), 0);
  KVC_ASSERT_OK(Mutate(*store_, id_, Streaming(4, 40)));
  // Compaction moved survivors into holes of the blocks the sequence had: no fresh block.
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot after, Lease(id_));
  for (size_t l = 0; l < after.lanes.size(); ++l) {
    const std::vector<BlockId>& had = lease.lanes[l].segments[0].blocks;
    for (BlockId b : after.lanes[l].segments[0].blocks) {
      EXPECT_NE(std::find(had.begin(), had.end(), b), had.end()) << "lane " << l << " block " << b;
    }
  }
  KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope(), after.lease_id));
}

TEST_F(LeaseTest, ExpiryReturnsTheBlocksWithoutAnyCall) {
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id_, {}, 100));
  EXPECT_EQ(lease.ttl_ms, 100);
  KVC_ASSERT_OK(store_->Release(id_));
  EXPECT_EQ(Used(), lease.leased_bytes);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Used() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Used(), 0) << "the reaper ends expired leases";
  EXPECT_EQ(Stats().expired, 1);
  EXPECT_EQ(Stats().active, 0);
  EXPECT_THAT(store_->leases().RenewLease(TenantScope(), lease.lease_id, 0),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->leases().ReleaseLease(TenantScope(), lease.lease_id),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(LeaseTest, RenewKeepsTheLeaseAlive) {
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id_, {}, 150));
  KVC_ASSERT_OK_AND_ASSIGN(const int64_t expires,
                           store_->leases().RenewLease(TenantScope(), lease.lease_id, 60000));
  EXPECT_GT(expires, lease.expires_unix_ms + 50000);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(Stats().active, 1) << "renewed past its first TTL";
  EXPECT_EQ(Stats().renewed, 1);
  KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope(), lease.lease_id));
}

// However often it is renewed, no lease lives past max_lifetime_ms after its grant: the
// renewal that would pass it gets the capped expiry, the next one FAILED_PRECONDITION, and
// the reaper ends the lease at the cap. A TTL longer than the lifetime is cut to it.
TEST_F(LeaseTest, RenewalsStopAtTheLifetimeLimit) {
  KvStoreOptions options = HostOptions();
  options.leases.max_lifetime_ms = 400;
  Reset(options);
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id_, {}, 200));
  KVC_ASSERT_OK_AND_ASSIGN(const std::vector<LeaseInfo> listed, store_->leases().ListLeases({}));
  ASSERT_EQ(listed.size(), 1u);
  const int64_t granted = listed[0].granted_unix_ms;
  EXPECT_EQ(lease.expires_unix_ms, granted + 200);
  KVC_ASSERT_OK_AND_ASSIGN(const int64_t capped,
                           store_->leases().RenewLease(TenantScope(), lease.lease_id, 60000));
  EXPECT_EQ(capped, granted + 400) << "renewed up to the cap, not past it";
  EXPECT_THAT(store_->leases().RenewLease(TenantScope(), lease.lease_id, 10),
              StatusIs(absl::StatusCode::kFailedPrecondition, "lease the sequence again"));
  EXPECT_EQ(store_->leases().ListLeases({})->at(0).renewals, 1);
  EXPECT_EQ(store_->leases().ListLeases({})->at(0).expires_unix_ms, granted + 400);

  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot longer, Lease(id_, {}, 60000));
  EXPECT_EQ(longer.ttl_ms, 400) << "a TTL past the lifetime is cut to it";
  EXPECT_LE(longer.expires_unix_ms, NowUnixMs() + 400);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Stats().expired < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Stats().expired, 2) << "both ended at their cap";
  EXPECT_GE(NowUnixMs(), granted + 400);
  EXPECT_THAT(store_->leases().RenewLease(TenantScope(), lease.lease_id, 10),
              StatusIs(absl::StatusCode::kNotFound));
  KVC_ASSERT_OK(Lease(id_).status()) << "leasing again is how a reader goes on";
}

TEST_F(LeaseTest, RefusalsChangeNothing) {
  Reset(HostOptions(/*max_ttl_ms=*/1000, /*max_per_scope=*/2));
  EXPECT_THAT(Lease("s-nope"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Lease(id_, {2}), StatusIs(absl::StatusCode::kInvalidArgument, "out of range"));
  EXPECT_THAT(Lease(id_, {-1}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Lease(id_, {1, 1}), StatusIs(absl::StatusCode::kInvalidArgument, "named twice"));
  EXPECT_THAT(Lease(id_, {}, 1001), StatusIs(absl::StatusCode::kInvalidArgument, "ttl_ms"));
  EXPECT_THAT(Lease(id_, {}, -5), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Lease(id_, {}, 0, "tenant-b"), StatusIs(absl::StatusCode::kNotFound))
      << "another scope's sequence is unknown";
  EXPECT_EQ(Pool()->shares().frozen_blocks(), 0);
  EXPECT_EQ(Stats().granted, 0);

  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot a, Lease(id_));
  EXPECT_EQ(a.ttl_ms, 1000) << "the default never exceeds the maximum";
  KVC_ASSERT_OK(Lease(id_).status());
  EXPECT_THAT(Lease(id_), StatusIs(absl::StatusCode::kResourceExhausted, "2 leases"));
  EXPECT_THAT(store_->leases().RenewLease(TenantScope("tenant-b"), a.lease_id, 0),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->leases().ReleaseLease(TenantScope("tenant-b"), a.lease_id),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->leases().RenewLease(TenantScope(), a.lease_id, 5000),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(Stats().active, 2);
  KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope(), a.lease_id));
  KVC_ASSERT_OK(Lease(id_).status()) << "a released lease frees its slot";
}

// Reads of the leased records race with every kind of mutation of the same sequence and its
// Release (TSan checks that no write touches a leased byte); each read is the snapshot.
TEST_F(LeaseTest, ConcurrentMutationsNeverReachTheLeasedSnapshot) {
  const Dump before = Read(*store_, id_);
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id_));
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, mismatches{0};
  std::thread reader([&] {
    while (!done.load()) {
      if (ReadLease(*store_, lease) != before) mismatches.fetch_add(1);
      reads.fetch_add(1);
    }
  });
  int64_t tokens = kTokens;
  for (int round = 0; round < 20; ++round) {
    KVC_ASSERT_OK(AppendTokens(id_, tokens, 24));
    tokens += 24;
    KVC_ASSERT_OK(Mutate(*store_, id_, Streaming(2 + round % 3, 30 + round % 7)));
  }
  KVC_ASSERT_OK(Mutate(*store_, id_, Int4()));
  KVC_ASSERT_OK(store_->Release(id_));
  while (reads.load() < 5) std::this_thread::yield();
  done.store(true);
  reader.join();
  EXPECT_EQ(mismatches.load(), 0) << "of " << reads.load() << " reads";
  KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope(), lease.lease_id));
  EXPECT_EQ(Used(), 0);
}

// A transfer's view of a lease (SendLeasedBlocks): what a sink receives, and what the lease
// says it should be.
class Collect final : public BlockSink {
 public:
  std::function<void()> on_begin;
  int64_t blocks = -1, announced = -1;
  std::string bytes;
  absl::Status Begin(int64_t n, int64_t b) override {
    blocks = n;
    announced = b;
    if (on_begin) on_begin();
    return absl::OkStatus();
  }
  absl::Status Write(const char* data, size_t n) override {
    bytes.append(data, n);
    return absl::OkStatus();
  }
};

// The payload SendLeasedBlocks must produce: per format in number order, the lease's blocks
// in lane order, each holding exactly the described records and zeros elsewhere.
std::string ExpectedBlocks(KvStore& store, const LeaseSnapshot& lease) {
  BlockPool* pool = *store.leases().FindPool(lease.pool);
  std::string out;
  for (int f = 0; f < kernels::kNumStorageFormats; ++f) {
    const auto format = static_cast<StorageFormat>(f);
    for (const LeasedLane& lane : lease.lanes) {
      for (const LeasedSegment& seg : lane.segments) {
        if (seg.format != format) continue;
        const kernels::BlockLayout l = pool->layout(format);
        const auto* base = static_cast<const char*>(pool->arena(format).base);
        for (size_t b = 0; b < seg.blocks.size(); ++b) {
          std::string block(l.block_bytes, '\0');
          const char* in = base + static_cast<size_t>(seg.blocks[b]) * l.block_bytes;
          const size_t bt = static_cast<size_t>(lease.block_tokens);
          const size_t n = std::min(bt, seg.positions.size() - b * bt);
          block.replace(l.key_offset, n * l.record_bytes, in + l.key_offset, n * l.record_bytes);
          block.replace(l.value_offset, n * l.record_bytes, in + l.value_offset,
                        n * l.record_bytes);
          out += block;
        }
      }
    }
  }
  return out;
}

TEST_F(LeaseTest, SendsTheLeasedBlocksWithUndescribedSlotsZeroed) {
  // A released sequence leaves its data in the blocks; a shorter one reuses them, so its
  // last, partly filled blocks hold stale records past its tokens: they must not be sent.
  const std::string old_seq = NewSequence(64);
  KVC_ASSERT_OK(store_->Release(old_seq));
  CompressionSpec tiers = Int4();
  tiers.residual_tokens = 8;  // two segments per lane: 13 INT4 tokens, 8 raw
  const std::string short_seq = NewSequence(21, tiers);
  KVC_ASSERT_OK(Mutate(*store_, id_, Int4()));
  for (const std::string& id : {id_, short_seq}) {
    SCOPED_TRACE(id);
    KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id));
    Collect sink;
    KVC_ASSERT_OK_AND_ASSIGN(
        const SentBlocks sent,
        SendLeasedBlocks(store_->leases(), TenantScope(), lease.lease_id, &sink));
    EXPECT_EQ(sent.bytes, static_cast<int64_t>(sink.bytes.size()));
    EXPECT_EQ(sink.announced, sent.bytes) << "Begin announces the whole payload";
    EXPECT_EQ(sink.blocks, sent.blocks);
    EXPECT_EQ(sent.bytes, lease.leased_bytes);
    EXPECT_TRUE(sink.bytes == ExpectedBlocks(*store_, lease)) << "payload differs";
    KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope(), lease.lease_id));
  }
}

TEST_F(LeaseTest, SendingAnEndedOrForeignLeaseSendsNothing) {
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id_));
  Collect sink;
  EXPECT_THAT(
      SendLeasedBlocks(store_->leases(), TenantScope("tenant-b"), lease.lease_id, &sink).status(),
      StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(sink.blocks, -1) << "refused before Begin";
  // Ended while it was being sent: whatever went out does not count.
  sink.on_begin = [&] {
    EXPECT_TRUE(store_->leases().ReleaseLease(TenantScope(), lease.lease_id).ok());
  };
  EXPECT_THAT(SendLeasedBlocks(store_->leases(), TenantScope(), lease.lease_id, &sink).status(),
              StatusIs(absl::StatusCode::kAborted, "ended while its blocks were sent"));
  EXPECT_TRUE(sink.bytes.empty()) << "nothing copied after the lease ended is written";
  Collect again;
  EXPECT_THAT(SendLeasedBlocks(store_->leases(), TenantScope(), lease.lease_id, &again).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

// Looking at a lease never extends it: reads through it (SendLeasedBlocks checks it live
// before and after each piece), listings and the sequence's own reads leave its expiry as
// granted, and it ends on time.
TEST_F(LeaseTest, LookupsNeverExtendALease) {
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(id_, {}, 1500));
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  // Looks while the lease is surely live (a loaded machine may take long per look).
  while (std::chrono::steady_clock::now() < until && NowUnixMs() < lease.expires_unix_ms - 800) {
    Collect sink;
    KVC_ASSERT_OK(
        SendLeasedBlocks(store_->leases(), TenantScope(), lease.lease_id, &sink).status());
    KVC_ASSERT_OK(store_->GetSequence(id_).status());
    EXPECT_EQ(Read(*store_, id_).chunks.size(), static_cast<size_t>(kLanes));
    KVC_ASSERT_OK_AND_ASSIGN(const std::vector<LeaseInfo> listed, store_->leases().ListLeases({}));
    ASSERT_EQ(listed.size(), 1u);
    EXPECT_EQ(listed[0].expires_unix_ms, lease.expires_unix_ms);
    EXPECT_EQ(listed[0].renewals, 0);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Stats().active > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(NowUnixMs(), lease.expires_unix_ms) << "ended at its expiry, not before";
  EXPECT_EQ(Stats().expired, 1);
  EXPECT_EQ(Stats().renewed, 0);
}

}  // namespace
}  // namespace kvc::cachesvc
