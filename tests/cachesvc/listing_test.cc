// ListSequences in pages (issue 43 item 4): pages follow creation order; following
// next_page_token visits every matching sequence exactly once, with the filters (pool, tenant
// label, scope) and the total applied to every page; sequences released or created between
// pages never appear twice and never push a live one out; the order is creation order (by
// millisecond, then scope, then exactly within a scope); a token this server never made is
// INVALID_ARGUMENT. The cost side (a page at 10,000 sequences ~ one at 100) is in
// stats_scaling_test.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/clock.h"
#include "cachesvc/core/store/kv_store.h"
#include "gtest/gtest.h"
#include "tests/testing/pool_device.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::StatusIs;

std::unique_ptr<KvStore> MakeStore() {
  KvStoreOptions o;
  for (const char* name : {"p0", "p1"}) {
    PoolOptions pool;
    pool.name = name;
    pool.device = testing::TestPoolDevice();
    pool.geometry = {2, 2, 4, 64, 16, DType::kF16, {}};
    pool.capacity_bytes = int64_t{16} << 20;
    o.pools.push_back(pool);
  }
  auto store = KvStore::Create(o);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

// Every page of `params` (limit as given), following the tokens; checks each page's total.
std::vector<std::string> AllPages(const KvStore& store, ListSequencesParams params,
                                  int64_t want_total) {
  std::vector<std::string> ids;
  for (int page = 0; page < 1000; ++page) {
    absl::StatusOr<SequenceList> list = store.stats().ListSequences(params);
    EXPECT_TRUE(list.ok()) << list.status();
    if (!list.ok()) break;
    EXPECT_EQ(list->total, want_total);
    EXPECT_LE(static_cast<int64_t>(list->sequences.size()), params.limit);
    for (const SequenceSnapshot& s : list->sequences) ids.push_back(s.id);
    if (list->next_page_token.empty()) break;
    EXPECT_EQ(static_cast<int64_t>(list->sequences.size()), params.limit)
        << "a page that is not the last is full";
    params.page_token = list->next_page_token;
  }
  return ids;
}

struct Made {
  std::string id, scope, tenant, pool;
  int64_t created_unix_ms = 0;
};

class ListingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = MakeStore();
    // 40 sequences: scopes "x" and "y", tenant labels t0..t2, pools p0/p1, interleaved.
    for (int i = 0; i < 40; ++i) {
      Made m{"", i % 2 == 0 ? "x" : "y", "t" + std::to_string(i % 3), i % 5 < 2 ? "p1" : "p0"};
      CreateSequenceParams p;
      p.scope = TenantScope(m.scope);
      p.tenant = m.tenant;
      p.pool = m.pool;
      absl::StatusOr<SequenceSnapshot> s = store_->CreateSequence(p);
      ASSERT_TRUE(s.ok()) << s.status();
      m.id = s->id;
      m.created_unix_ms = s->created_unix_ms;
      made_.push_back(m);
    }
    // The listing order: creation time, then scope, then creation within the scope.
    std::stable_sort(made_.begin(), made_.end(), [](const Made& a, const Made& b) {
      return std::tie(a.created_unix_ms, a.scope) < std::tie(b.created_unix_ms, b.scope);
    });
  }
  // The ids of made_ matching the filters, in listing order.
  std::vector<std::string> Expected(const std::string* scope, const std::string& tenant,
                                    const std::string& pool) const {
    std::vector<std::string> ids;
    for (const Made& m : made_) {
      if ((scope == nullptr || m.scope == *scope) && (tenant.empty() || m.tenant == tenant) &&
          (pool.empty() || m.pool == pool)) {
        ids.push_back(m.id);
      }
    }
    return ids;
  }

  std::unique_ptr<KvStore> store_;
  std::vector<Made> made_;
};

TEST_F(ListingTest, PagesVisitEveryMatchingSequenceOnceInCreationOrder) {
  const std::string x = "x";
  for (const std::string* scope : {static_cast<const std::string*>(nullptr), &x}) {
    for (const std::string tenant : {"", "t1"}) {
      for (const std::string pool : {"", "p1"}) {
        for (const int64_t limit : {1, 3, 7, 40, 1000}) {
          SCOPED_TRACE(::testing::Message() << "scope " << (scope ? *scope : "(all)") << " tenant '"
                                            << tenant << "' pool '" << pool << "' limit " << limit);
          ListSequencesParams p;
          if (scope != nullptr) p.scope = TenantScope(*scope);
          p.tenant = tenant;
          p.pool = pool;
          p.limit = limit;
          const std::vector<std::string> want = Expected(scope, tenant, pool);
          ASSERT_FALSE(want.empty());
          EXPECT_EQ(AllPages(*store_, p, static_cast<int64_t>(want.size())), want);
        }
      }
    }
  }
}

TEST_F(ListingTest, ReleasesAndCreatesBetweenPagesNeverRepeatOrSkipALiveOne) {
  ListSequencesParams p;
  p.limit = 10;
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceList first, store_->stats().ListSequences(p));
  ASSERT_EQ(first.sequences.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(first.sequences[i].id, made_[i].id) << i;
  // The page's last sequence and one on the next page go; a new one comes (it is newest).
  absl::SleepFor(absl::Milliseconds(2));
  KVC_ASSERT_OK(store_->Release(made_[9].id, TenantScope(made_[9].scope)).status());
  KVC_ASSERT_OK(store_->Release(made_[12].id, TenantScope(made_[12].scope)).status());
  CreateSequenceParams c;
  c.scope = TenantScope("x");
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot newest, store_->CreateSequence(c));
  std::vector<std::string> rest;
  p.page_token = first.next_page_token;
  for (;;) {
    KVC_ASSERT_OK_AND_ASSIGN(const SequenceList page, store_->stats().ListSequences(p));
    EXPECT_EQ(page.total, 39);
    for (const SequenceSnapshot& s : page.sequences) rest.push_back(s.id);
    if (page.next_page_token.empty()) break;
    p.page_token = page.next_page_token;
  }
  std::vector<std::string> want;
  for (size_t i = 10; i < made_.size(); ++i) {
    if (i != 12) want.push_back(made_[i].id);
  }
  want.push_back(newest.id);
  EXPECT_EQ(rest, want);
}

TEST_F(ListingTest, ATokenTheServerNeverMadeIsInvalidArgument) {
  ListSequencesParams p;
  for (const std::string& token :
       std::vector<std::string>{"garbage!", "bm90IGEgdG9rZW4", std::string(2000, 'A')}) {
    p.page_token = token;
    EXPECT_THAT(store_->stats().ListSequences(p).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, "page_token is not one"));
  }
  // A tenant's page never reaches another scope, whatever its token says.
  p.page_token.clear();
  p.scope = TenantScope("y");
  p.limit = 1;
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceList y, store_->stats().ListSequences(p));
  p.scope = TenantScope("x");
  p.page_token = y.next_page_token;
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceList x, store_->stats().ListSequences(p));
  for (const SequenceSnapshot& s : x.sequences) EXPECT_NE(s.tenant, "") << s.id;
  std::set<std::string> of_x;
  for (const Made& m : made_) {
    if (m.scope == "x") of_x.insert(m.id);
  }
  for (const SequenceSnapshot& s : x.sequences) EXPECT_TRUE(of_x.count(s.id)) << s.id;
}

TEST_F(ListingTest, ATenantsPoolStatsCountItsSequencesInThatPool) {
  for (const std::string tenant : {"t0", "t1", "t2"}) {
    KVC_ASSERT_OK_AND_ASSIGN(const PoolStatsSnapshot stats,
                             store_->stats().TenantPoolStats(tenant, "p1"));
    EXPECT_EQ(stats.sequences, static_cast<int64_t>(Expected(nullptr, tenant, "p1").size()))
        << tenant;
  }
}

}  // namespace
}  // namespace kvc::cachesvc
