// Leases are accounted (issue 38, item 2): a tenant's account in a pool is the bytes its
// sequences hold plus the bytes of blocks only its leases still pin (a Release, Evict,
// copy-on-write, compaction or format conversion left them to a lease), so leasing and
// releasing cannot pin more than the quota; mutations of a leased sequence reserve the bytes
// its leases keep; the account settles exactly however the leases change meanwhile; the
// statistics show the pinned bytes. The model test recomputes every tenant's holdings from
// the blocks its sequences and leases name, after every step of a random schedule.
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "cachesvc/core/store/kv_store.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/cachesvc/compression_fixture.h"
#include "tests/testing/forwarding_backend.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::StatusIs;

constexpr int64_t kQuota = int64_t{256} << 10;  // the probe's
constexpr char kPool[] = "c";

// A block of a pool, named as a lease names it.
using BlockKey = std::pair<StorageFormat, BlockId>;

// Calls `on_convert` (once) from inside the next format conversion's read: a Compress's
// Execute, with the sequence's lock held and its commit still to come.
class ConvertHook final : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::function<void()> on_convert;
  kernels::KernelStatus ReadTokens(const kernels::ReadTokensArgs& a,
                                   kernels::StreamHandle h) override {
    if (on_convert && a.dtype == DType::kF32) std::exchange(on_convert, nullptr)();
    return ForwardingBackend::ReadTokens(a, h);
  }
};

class LeaseQuotaTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(kQuota); }

  void Start(int64_t quota, const std::string& device = "cpu") {
    KvStoreOptions o = Options(Geometry{}, int64_t{16} << 20);
    o.pools[0].device = device;
    o.quotas = {{"a", quota, 0, 0, 0}, {"b", quota, 0, 0, 0}};
    o.hooks.wrap_backend = [this](std::unique_ptr<kernels::KernelBackend> inner) {
      auto hook = std::make_unique<ConvertHook>(std::move(inner));
      hook_ = hook.get();
      return hook;
    };
    store_.reset();
    auto created = KvStore::Create(o);
    ASSERT_TRUE(created.ok()) << created.status();
    store_ = std::move(*created);
  }

  // Tenants act in their own scope, as authenticated callers do.
  absl::StatusOr<std::string> Create(const std::string& tenant,
                                     std::optional<PrefixSpec> prefix = std::nullopt) {
    KVC_ASSIGN_OR_RETURN(const SequenceSnapshot s,
                         store_->CreateSequence(CreateSequenceParams{
                             TenantScope(tenant), "", tenant, "", {}, std::move(prefix)}));
    return s.id;
  }
  // Appends `n` tokens to each layer from where that layer is (an append refused over quota
  // leaves its layer as it was).
  absl::Status Append(const std::string& tenant, const std::string& id, int64_t n) {
    KVC_ASSIGN_OR_RETURN(const SequenceSnapshot s, store_->GetSequence(id, TenantScope(tenant)));
    for (int l = 0; l < 2; ++l) {
      const int64_t start = s.layer_tokens[static_cast<size_t>(l)];
      const std::vector<float> k =
          Gaussian(static_cast<size_t>(n * 2 * 64), 1000 * l + static_cast<uint32_t>(start));
      const std::vector<float> v = Gaussian(k.size(), 7 + 1000 * l + static_cast<uint32_t>(start));
      AppendParams a;
      a.scope = TenantScope(tenant);
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
  absl::StatusOr<LeaseSnapshot> Lease(const std::string& tenant, const std::string& id,
                                      int64_t ttl_ms = 0) {
    return store_->leases().LeaseSequence(LeaseParams{TenantScope(tenant), id, {}, ttl_ms});
  }
  absl::Status Compress(const std::string& tenant, const std::string& id,
                        const CompressionSpec& spec) {
    CompressParams p;
    p.scope = TenantScope(tenant);
    p.sequence_id = id;
    p.spec = spec;
    return store_->Compress(p).status();
  }

  // The tenant's account in the pool, and the part of it only its leases pin.
  int64_t Account(const std::string& tenant) {
    return store_->stats().TenantPoolStats(tenant, kPool)->used_bytes;
  }
  int64_t LeaseOnly(const std::string& tenant) {
    return store_->stats().TenantPoolStats(tenant, kPool)->leases.lease_only_bytes;
  }
  int64_t Used() { return store_->stats().ListPools()[0].used_bytes; }
  BlockPool* Pool() { return *store_->leases().FindPool(kPool); }
  int64_t BlockBytes(StorageFormat f) {
    return static_cast<int64_t>(Pool()->layout(f).block_bytes);
  }
  int64_t SizeOf(const std::set<BlockKey>& blocks) {
    int64_t bytes = 0;
    for (const auto& [format, block] : blocks) bytes += BlockBytes(format);
    return bytes;
  }
  static std::set<BlockKey> BlocksOf(const LeaseSnapshot& lease) {
    std::set<BlockKey> blocks;
    for (const LeasedLane& lane : lease.lanes) {
      for (const LeasedSegment& seg : lane.segments) {
        for (BlockId b : seg.blocks) blocks.insert({seg.format, b});
      }
    }
    return blocks;
  }
  // The blocks a sequence holds now, read from a lease that lives only for the look (it pins
  // blocks the sequence holds: no account changes).
  std::set<BlockKey> BlocksOf(const std::string& tenant, const std::string& id) {
    auto lease = Lease(tenant, id);
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return {};
    EXPECT_TRUE(store_->leases().ReleaseLease(TenantScope(tenant), lease->lease_id).ok());
    return BlocksOf(*lease);
  }
  // Waits until the reaper has ended `lease_id` (its expiry must have passed or be near).
  void AwaitEnded(const std::string& lease_id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    auto live = [&] {
      const std::vector<LeaseInfo> listed = *store_->leases().ListLeases({});
      for (const LeaseInfo& l : listed) {
        if (l.lease_id == lease_id) return true;
      }
      return false;
    };
    while (live() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // Expired leases are hidden before the reaper ends them: wait for the reaper too.
    while (store_->stats().LeaseStatsFor("")->active >
               static_cast<int64_t>(store_->leases().ListLeases({})->size()) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  std::unique_ptr<KvStore> store_;
  ConvertHook* hook_ = nullptr;
};

// The probe: fill the quota, lease, release, fill again. The second fill is refused, the
// account says what the lease pins, and the bytes come back when the lease ends.
TEST_F(LeaseQuotaTest, FillLeaseReleaseCannotPinMoreThanTheQuota) {
  KVC_ASSERT_OK_AND_ASSIGN(const std::string first, Create("a"));
  KVC_ASSERT_OK(Append("a", first, 128));  // 8 blocks per lane, 4 lanes of 8 KiB blocks
  ASSERT_EQ(Account("a"), kQuota) << "the fill takes exactly the quota";
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease("a", first));
  EXPECT_EQ(Account("a"), kQuota) << "granting a lease adds nothing";
  KVC_ASSERT_OK(store_->Release(first, TenantScope("a")));
  EXPECT_EQ(Account("a"), kQuota) << "the charge moved from the sequence to the lease";
  EXPECT_EQ(LeaseOnly("a"), kQuota);
  EXPECT_EQ(Used(), kQuota);

  // Fill again, four times over: every try is refused before it stores a byte.
  for (int round = 0; round < 4; ++round) {
    KVC_ASSERT_OK_AND_ASSIGN(const std::string again, Create("a"));
    EXPECT_THAT(Append("a", again, 128),
                StatusIs(absl::StatusCode::kResourceExhausted, "pinned only by its leases"));
    KVC_ASSERT_OK(store_->Release(again, TenantScope("a")));
    EXPECT_EQ(Used(), kQuota);
  }
  // Every view shows the pinned bytes.
  KVC_ASSERT_OK_AND_ASSIGN(const PoolStatsSnapshot pool, store_->stats().GetPoolStats(kPool));
  EXPECT_EQ(pool.leases.lease_only_bytes, kQuota);
  const std::vector<TenantUsageSnapshot> usage = store_->stats().TenantUsage();
  ASSERT_EQ(usage.size(), 1u) << "the lease keeps the tenant's account";
  EXPECT_EQ(usage[0].pool_bytes[0], kQuota);
  EXPECT_EQ(usage[0].lease_only_bytes[0], kQuota);
  KVC_ASSERT_OK_AND_ASSIGN(const std::vector<LeaseInfo> listed, store_->leases().ListLeases({}));
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].lease_only_bytes, kQuota);
  EXPECT_EQ(listed[0].tenant, "a");
  EXPECT_EQ(listed[0].sequence_id, first);

  // Tenant b is not affected.
  KVC_ASSERT_OK_AND_ASSIGN(const std::string theirs, Create("b"));
  KVC_ASSERT_OK(Append("b", theirs, 128));
  EXPECT_EQ(Account("b"), kQuota);
  KVC_ASSERT_OK(store_->Release(theirs, TenantScope("b")));

  KVC_ASSERT_OK_AND_ASSIGN(const int64_t freed,
                           store_->leases().ReleaseLease(TenantScope("a"), lease.lease_id));
  EXPECT_EQ(freed * BlockBytes(StorageFormat::kF32), kQuota);
  EXPECT_EQ(Account("a"), 0);
  EXPECT_EQ(Used(), 0);
  EXPECT_EQ(store_->stats().GetPoolStats(kPool)->leases.lease_only_bytes, 0);
  KVC_ASSERT_OK_AND_ASSIGN(const std::string last, Create("a"));
  KVC_ASSERT_OK(Append("a", last, 128)) << "the quota is free again";
}

// A mutation that frees leased blocks frees nothing of the tenant's: at the quota, a format
// conversion (the f32 blocks stay with the lease) or a copy-on-write compaction is refused and
// changes nothing, while without the lease the same conversion is allowed (it shrinks). With
// room, both the leased blocks and their replacements are charged.
TEST_F(LeaseQuotaTest, MutationsOfALeasedSequenceReserveWhatTheLeaseKeeps) {
  {
    KVC_ASSERT_OK_AND_ASSIGN(const std::string id, Create("a"));
    KVC_ASSERT_OK(Append("a", id, 128));
    ASSERT_EQ(Account("a"), kQuota);
    KVC_ASSERT_OK(Compress("a", id, Int4())) << "no lease: the conversion shrinks the tenant";
    EXPECT_EQ(Account("a"), store_->GetSequence(id, TenantScope("a"))->bytes);
    EXPECT_LT(Account("a"), kQuota);
  }
  Start(kQuota);
  KVC_ASSERT_OK_AND_ASSIGN(const std::string id, Create("a"));
  KVC_ASSERT_OK(Append("a", id, 128));
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease("a", id));
  const SequenceSnapshot before = *store_->GetSequence(id, TenantScope("a"));
  const int64_t used = Used();
  EXPECT_THAT(Compress("a", id, Int4()),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_bytes_per_pool"));
  EXPECT_THAT(Compress("a", id, Streaming(4, 40)),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_bytes_per_pool"));
  EXPECT_EQ(Account("a"), kQuota) << "refusals change nothing";
  EXPECT_EQ(Used(), used);
  const SequenceSnapshot after = *store_->GetSequence(id, TenantScope("a"));
  EXPECT_EQ(after.storage, StorageFormat::kF32);
  EXPECT_EQ(after.stored_token_heads, before.stored_token_heads);
  KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope("a"), lease.lease_id));
  KVC_ASSERT_OK(store_->Release(id, TenantScope("a")));

  // Half the quota leased: the conversion fits, and the tenant pays for both copies.
  KVC_ASSERT_OK_AND_ASSIGN(const std::string half, Create("a"));
  KVC_ASSERT_OK(Append("a", half, 64));
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot pinned, Lease("a", half));
  KVC_ASSERT_OK(Compress("a", half, Int4()));
  const int64_t int4 = store_->GetSequence(half, TenantScope("a"))->bytes;
  EXPECT_EQ(Account("a"), pinned.leased_bytes + int4);
  EXPECT_EQ(LeaseOnly("a"), pinned.leased_bytes);
  KVC_ASSERT_OK(Compress("a", half, Streaming(4, 20)));  // INT4 blocks not leased: in place
  EXPECT_EQ(Account("a"), pinned.leased_bytes + store_->GetSequence(half, TenantScope("a"))->bytes);
  KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope("a"), pinned.lease_id));
  EXPECT_EQ(Account("a"), store_->GetSequence(half, TenantScope("a"))->bytes);
  EXPECT_EQ(LeaseOnly("a"), 0);
}

// The lease ends while a Compress runs (between its reservation and its commit): the
// reservation counted the leased blocks as kept, the commit finds them free, and the account
// ends exactly at what the sequence holds, not off by the reservation.
TEST_F(LeaseQuotaTest, ALeaseEndingDuringAMutationSettlesExactly) {
  KVC_ASSERT_OK_AND_ASSIGN(const std::string id, Create("a"));
  KVC_ASSERT_OK(Append("a", id, 64));  // half the quota: its INT4 copy fits beside the lease
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease("a", id));
  bool ended = false;
  hook_->on_convert = [&] {
    ended = store_->leases().ReleaseLease(TenantScope("a"), lease.lease_id).ok();
  };
  KVC_ASSERT_OK(Compress("a", id, Int4()));
  ASSERT_TRUE(ended) << "the hook ran inside the Compress";
  EXPECT_EQ(Account("a"), store_->GetSequence(id, TenantScope("a"))->bytes);
  EXPECT_EQ(LeaseOnly("a"), 0);
  EXPECT_EQ(Used(), store_->GetSequence(id, TenantScope("a"))->bytes);

  // And the other way: a lease granted before, released by nobody, keeps what it pins.
  KVC_ASSERT_OK_AND_ASSIGN(const std::string id2, Create("a"));
  KVC_ASSERT_OK(Append("a", id2, 32));
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot kept, Lease("a", id2));
  KVC_ASSERT_OK(Compress("a", id2, Int4()));
  EXPECT_EQ(Account("a"), store_->GetSequence(id, TenantScope("a"))->bytes +
                              store_->GetSequence(id2, TenantScope("a"))->bytes +
                              kept.leased_bytes);
  KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope("a"), kept.lease_id));
  KVC_ASSERT_OK(store_->Release(id, TenantScope("a")));
  KVC_ASSERT_OK(store_->Release(id2, TenantScope("a")));
  EXPECT_EQ(Account("a"), 0);
  EXPECT_EQ(Used(), 0);
}

// A published prefix whose sequence is released while a lease pins it: the prefix index and
// the lease hold it, no sequence does, so the lessee pays (the index's hold is the pool's
// cache, not a way around the quota). A sequence that attaches the prefix takes the charge
// over; when it goes again the lease pays again.
TEST_F(LeaseQuotaTest, APublishedPrefixOnlyALeasePinsIsCharged) {
  PrefixSpec prefix{"model", "salt", {}};
  for (int i = 0; i < 64; ++i) prefix.token_ids.push_back(i);
  KVC_ASSERT_OK_AND_ASSIGN(const std::string id, Create("a"));
  KVC_ASSERT_OK(Append("a", id, 64));
  KVC_ASSERT_OK(
      store_->prefixes().PublishPrefix(PublishPrefixParams{TenantScope("a"), id, prefix}).status());
  const int64_t bytes = store_->GetSequence(id, TenantScope("a"))->bytes;
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease("a", id));
  KVC_ASSERT_OK(store_->Release(id, TenantScope("a")));
  EXPECT_EQ(Account("a"), bytes) << "index + lease, no sequence: the lease pays";
  EXPECT_EQ(LeaseOnly("a"), bytes);

  KVC_ASSERT_OK_AND_ASSIGN(const std::string attached, Create("a", prefix));
  EXPECT_EQ(store_->GetSequence(attached, TenantScope("a"))->attached_tokens, 64);
  EXPECT_EQ(Account("a"), bytes) << "the attaching sequence pays instead: counted once";
  EXPECT_EQ(LeaseOnly("a"), 0);
  KVC_ASSERT_OK(store_->Release(attached, TenantScope("a")));
  EXPECT_EQ(Account("a"), bytes);
  EXPECT_EQ(LeaseOnly("a"), bytes);
  KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope("a"), lease.lease_id));
  EXPECT_EQ(Account("a"), 0) << "the cached prefix is the pool's again";
  EXPECT_EQ(Used(), bytes);
}

// Without authentication every tenant label shares scope "": two accounts' leases can pin
// the same block (a shared prefix). The first lessee pays; when its lease ends, the other.
TEST_F(LeaseQuotaTest, ABlockTwoAccountsLeasePaysOnceAndMovesToTheOther) {
  PrefixSpec prefix{"model", "", {}};
  for (int i = 0; i < 32; ++i) prefix.token_ids.push_back(i);
  auto create = [&](const std::string& tenant, std::optional<PrefixSpec> p) {
    return store_->CreateSequence(
        CreateSequenceParams{TenantScope(), "", tenant, "", {}, std::move(p)});
  };
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot a, create("a", std::nullopt));
  KVC_ASSERT_OK(Append("", a.id, 32));
  KVC_ASSERT_OK(
      store_->prefixes().PublishPrefix(PublishPrefixParams{TenantScope(), a.id, prefix}).status());
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot b, create("b", prefix));
  ASSERT_EQ(b.attached_tokens, 32);
  const int64_t bytes = store_->GetSequence(a.id)->bytes;
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot la, Lease("", a.id));
  KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lb, Lease("", b.id));
  KVC_ASSERT_OK(store_->Release(a.id));
  KVC_ASSERT_OK(store_->Release(b.id));
  EXPECT_EQ(Account("a") + Account("b"), bytes) << "one block, paid once";
  EXPECT_EQ(store_->stats().GetPoolStats(kPool)->leases.lease_only_bytes, bytes);
  KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope(), la.lease_id));
  EXPECT_EQ(Account("a"), 0);
  EXPECT_EQ(Account("b"), bytes) << "the remaining lessee pays";
  KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope(), lb.lease_id));
  EXPECT_EQ(Account("b"), 0);
  EXPECT_EQ(store_->stats().GetPoolStats(kPool)->leases.lease_only_bytes, 0);
}

// The model: two tenants with quotas, a random schedule of Create, Append, Lease, Release,
// Fork, Compress (eviction, INT4 conversion, both), ReleaseLease and expiry. After every
// step each account equals the bytes of its sequences plus the bytes of the blocks its leases
// name that no sequence holds, and stays within the quota; the pool's used bytes are the
// distinct blocks held. When everything has ended, every account and the pool are back at 0.
TEST_F(LeaseQuotaTest, RandomScheduleKeepsEveryAccountEqualToItsHoldings) {
  const std::vector<std::string> tenants = {"a", "b"};
  int refused = 0, lease_only_seen = 0;
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Start(kQuota);
    std::mt19937 rng(seed);
    auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
    std::map<std::string, std::vector<std::string>> sequences;  // tenant -> ids
    struct Held {
      std::string tenant;
      std::set<BlockKey> blocks;
    };
    // In grant order (ids are random: a map by id would pick differently in every run).
    std::vector<std::pair<std::string, Held>> leases;  // lease id, what it pins

    auto check = [&](const std::string& step) {
      SCOPED_TRACE(step);
      std::set<BlockKey> in_sequences;
      std::map<std::string, int64_t> sequence_bytes;
      for (const auto& [tenant, ids] : sequences) {
        for (const std::string& id : ids) {
          sequence_bytes[tenant] += store_->GetSequence(id, TenantScope(tenant))->bytes;
          for (const BlockKey& b : BlocksOf(tenant, id)) in_sequences.insert(b);
        }
      }
      std::set<BlockKey> all = in_sequences;
      for (const std::string& tenant : tenants) {
        std::set<BlockKey> lease_only;
        for (const auto& [id, held] : leases) {
          if (held.tenant != tenant) continue;
          for (const BlockKey& b : held.blocks) {
            all.insert(b);
            if (!in_sequences.count(b)) lease_only.insert(b);
          }
        }
        if (!lease_only.empty()) ++lease_only_seen;
        EXPECT_EQ(Account(tenant), sequence_bytes[tenant] + SizeOf(lease_only)) << tenant;
        EXPECT_EQ(LeaseOnly(tenant), SizeOf(lease_only)) << tenant;
        EXPECT_LE(Account(tenant), kQuota) << tenant;
      }
      EXPECT_EQ(Used(), SizeOf(all));
    };
    auto counted = [&](const absl::Status& s) {
      if (absl::IsResourceExhausted(s)) {
        ++refused;
      } else {
        EXPECT_TRUE(s.ok()) << s;
      }
      return s.ok();
    };

    for (int step = 0; step < 200; ++step) {
      const std::string& tenant = tenants[pick(2)];
      std::vector<std::string>& mine = sequences[tenant];
      const int op = mine.empty() ? 0 : static_cast<int>(pick(9));
      std::string what;
      if (op == 0 && mine.size() < 5) {
        what = "create";
        KVC_ASSERT_OK_AND_ASSIGN(const std::string id, Create(tenant));
        mine.push_back(id);
        counted(Append(tenant, id, 1 + static_cast<int64_t>(pick(70))));
      } else if (op <= 1) {
        what = "append";
        counted(Append(tenant, mine[pick(mine.size())], 1 + static_cast<int64_t>(pick(40))));
      } else if (op == 2) {
        what = "lease";
        const std::string& id = mine[pick(mine.size())];
        KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, Lease(tenant, id, 300000));
        leases.emplace_back(lease.lease_id, Held{tenant, BlocksOf(lease)});
      } else if (op == 3) {
        what = "release";
        const size_t i = pick(mine.size());
        KVC_ASSERT_OK(store_->Release(mine[i], TenantScope(tenant)));
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (op == 4 && mine.size() < 5) {
        what = "fork";
        auto fork = store_->ForkSequence(
            ForkSequenceParams{TenantScope(tenant), mine[pick(mine.size())], ""});
        if (counted(fork.status())) mine.push_back(fork->id);
      } else if (op == 5 || op == 6) {
        CompressionSpec spec;
        switch (pick(3)) {
          case 0:
            what = "compress: evict";
            spec = Streaming(2 + static_cast<int>(pick(3)), 16 + static_cast<int>(pick(40)));
            break;
          case 1:
            what = "compress: int4";
            spec = Int4();
            break;
          default:
            what = "compress: evict + int4";
            spec = Streaming(2, 24 + static_cast<int>(pick(24)));
            spec.storage = StorageFormat::kInt4G32;
            spec.storage_set = true;
        }
        counted(Compress(tenant, mine[pick(mine.size())], spec));
      } else if (!leases.empty() && op == 7) {
        what = "release lease";
        auto it = std::next(leases.begin(), static_cast<std::ptrdiff_t>(pick(leases.size())));
        KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope(it->second.tenant), it->first));
        leases.erase(it);
      } else if (!leases.empty()) {
        what = "expire";
        auto it = std::next(leases.begin(), static_cast<std::ptrdiff_t>(pick(leases.size())));
        KVC_ASSERT_OK(
            store_->leases().RenewLease(TenantScope(it->second.tenant), it->first, 1).status());
        const int64_t expired = store_->stats().LeaseStatsFor("")->expired;
        AwaitEnded(it->first);
        EXPECT_EQ(store_->stats().LeaseStatsFor("")->expired, expired + 1);
        leases.erase(it);
      } else {
        continue;
      }
      check(absl::StrCat("step ", step, ": ", tenant, " ", what));
      if (::testing::Test::HasFailure()) return;
    }
    for (const auto& [id, held] : leases)
      KVC_ASSERT_OK(store_->leases().ReleaseLease(TenantScope(held.tenant), id));
    for (const auto& [tenant, ids] : sequences) {
      for (const std::string& id : ids) KVC_ASSERT_OK(store_->Release(id, TenantScope(tenant)));
    }
    for (const std::string& tenant : tenants) EXPECT_EQ(Account(tenant), 0) << tenant;
    EXPECT_EQ(Used(), 0);
    EXPECT_EQ(Pool()->shares().frozen_blocks(), 0);
    EXPECT_EQ(Pool()->shares().lease_only_bytes(), 0);
    EXPECT_TRUE(store_->stats().TenantUsage().empty()) << "no account outlives its last holder";
  }
  EXPECT_GT(refused, 20) << "the schedules reached the quotas";
  EXPECT_GT(lease_only_seen, 40) << "the schedules left blocks to leases";
}

}  // namespace
}  // namespace kvc::cachesvc
