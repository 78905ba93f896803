// A cluster of three real kvcached processes (loopback) driven through kvc::client::ClusterClient:
// placement spread and weights, kill -9 of a shard under load (the other shards see no error,
// the dead shard's sequences get UNAVAILABLE, every fetched byte is checked, new sequences land
// on the live shards), its restart (it rejoins empty; ids of its earlier life are NOT_FOUND),
// a hung shard (SIGSTOP: deadlines, ejection, readmission after SIGCONT with its KV intact) and
// a draining one (no new sequences, its own still served; SIGTERM lets a stream in flight
// finish).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
#include "kvc/client/cluster_client.h"
#include "kvc/client/kv_cache_client.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/kvcached_process.h"

namespace kvc::client {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Sanitizer builds run 5-10x slower: less load, the same assertions.
constexpr bool kSanitized = sizeof(KVC_SANITIZE_NAME) > 1;

constexpr int kLayers = 2, kHeads = 2, kDim = 32, kTokens = 48;

std::string ConfigText() {
  return "pools { name: 'c' capacity_bytes: 67108864 geometry { num_layers: 2 num_kv_heads: 2 "
         "num_query_heads: 4 head_dim: 32 block_tokens: 16 dtype: DTYPE_F16 } }\n";
}

// Deterministic per sequence: a sequence served with another one's bytes fails the check.
uint32_t SeedOf(const std::string& id) {
  return static_cast<uint32_t>(std::hash<std::string>()(id));
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvc-cluster-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream(dir_ + "/kvcached.conf") << ConfigText();
  }
  void TearDown() override {
    if (HasFailure()) {
      for (const auto& s : shards_) std::fprintf(stderr, "--- log:\n%s\n", s->Log().c_str());
      if (cluster_ != nullptr) {
        for (const ShardStatus& s : cluster_->Shards()) {
          std::fprintf(stderr, "%s %s %s %s\n", s.address.c_str(), s.shard.c_str(),
                       ShardStateName(s.state), s.last_error.c_str());
        }
      }
    }
    cluster_.reset();
    shards_.clear();
    std::filesystem::remove_all(dir_);
  }

  // Starts shards kc-0 .. kc-(n-1), weights[i] each, and a cluster client over them. With
  // `local_sockets` each shard also serves same-node readers at <its dir>/kvcached.sock.
  void StartCluster(int n, std::vector<double> weights = {}, int grace_seconds = 10,
                    bool local_sockets = false) {
    std::vector<std::string> targets;
    for (int i = 0; i < n; ++i) {
      const std::string shard_dir = absl::StrCat(dir_, "/kc-", i);
      std::filesystem::create_directories(shard_dir);
      if (!weights.empty()) {
        std::ofstream(shard_dir + "/kvcached.conf")
            << ConfigText() << "shard { weight: " << weights[static_cast<size_t>(i)] << " }\n";
      } else {
        std::filesystem::copy_file(dir_ + "/kvcached.conf", shard_dir + "/kvcached.conf");
      }
      std::vector<std::string> args{"--config=" + shard_dir + "/kvcached.conf",
                                    "--listen=127.0.0.1:0", "--metrics_listen=off",
                                    absl::StrCat("--shard=kc-", i),
                                    absl::StrCat("--shutdown_grace_seconds=", grace_seconds)};
      if (local_sockets) {
        args.push_back("--local_socket=" + shard_dir + "/kvcached.sock");
        args.push_back("--local_socket_allow_same_uid");
      }
      shards_.push_back(
          std::make_unique<testing::KvcachedProcess>(KVCACHED_PATH, shard_dir, std::move(args)));
      ASSERT_FALSE(shards_.back()->target().empty()) << shards_.back()->Log();
      targets.push_back(shards_.back()->target());
    }
    ClusterOptions options;
    options.targets = targets;
    options.client.default_deadline = absl::Seconds(10);
    options.eject_time = absl::Milliseconds(500);
    options.health_timeout = absl::Milliseconds(500);
    options.probe_interval = absl::Milliseconds(100);
    auto cluster = ClusterClient::Connect(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    const absl::Status up = cluster_->WaitForShards(n, absl::Seconds(30));
    ASSERT_TRUE(up.ok()) << up;
  }

  static std::string ShardOf(const std::string& id) {
    auto shard = ClusterClient::ShardOf(id);
    return shard.ok() ? *shard : "?";
  }

  // Creates a sequence and appends kTokens on every layer; returns its id.
  absl::StatusOr<std::string> CreateFilled(const CallOptions& call = {}) {
    auto info = cluster_->CreateSequence({}, call);
    if (!info.ok()) return info.status();
    const std::string& id = info->sequence_id;
    for (int layer = 0; layer < kLayers; ++layer) {
      const std::string k = testing::MakeKv(SeedOf(id), layer, 0, kTokens, kHeads, kDim,
                                            kernels::DType::kF16, /*is_value=*/false);
      const std::string v = testing::MakeKv(SeedOf(id), layer, 0, kTokens, kHeads, kDim,
                                            kernels::DType::kF16, /*is_value=*/true);
      auto appended = cluster_->Append(
          {id, layer, 0, kTokens, DType::kF16, k.data(), v.data(), k.size()}, call);
      if (!appended.ok()) return appended.status();
    }
    return id;
  }

  // `n` sequences made by CreateFilled (ids empty where one failed: the caller asserts).
  std::vector<std::string> FillMany(int n) {
    std::vector<std::string> ids;
    ids.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      auto id = CreateFilled();
      EXPECT_TRUE(id.ok()) << id.status();
      ids.push_back(id.ok() ? *id : "");
    }
    return ids;
  }

  // New sequences (created and released again) never land on `shard`.
  void ExpectNewSequencesAvoid(const std::string& shard) {
    for (int i = 0; i < 30; ++i) {
      auto other = cluster_->CreateSequence({});
      ASSERT_TRUE(other.ok()) << other.status();
      EXPECT_NE(ShardOf(other->sequence_id), shard);
      ASSERT_TRUE(cluster_->Release(other->sequence_id).ok());
    }
  }

  // Fetches the sequence and compares every byte with what CreateFilled wrote. OK only when
  // the server answered and every byte matched; a mismatch is DATA_LOSS.
  absl::Status FetchAndCheck(const std::string& id, const CallOptions& call = {}) {
    auto fetched = cluster_->Fetch(id, {}, call);
    if (!fetched.ok()) return fetched.status();
    if (fetched->heads.size() != static_cast<size_t>(kLayers * kHeads)) {
      return absl::DataLossError(absl::StrCat(id, ": ", fetched->heads.size(), " heads"));
    }
    for (const FetchedHead& h : fetched->heads) {
      const std::string k = testing::MakeHeadKv(SeedOf(id), h.layer, h.kv_head, 0, kTokens, kDim,
                                                kernels::DType::kF16, /*is_value=*/false);
      const std::string v = testing::MakeHeadKv(SeedOf(id), h.layer, h.kv_head, 0, kTokens, kDim,
                                                kernels::DType::kF16, /*is_value=*/true);
      if (h.keys != k || h.values != v) {
        return absl::DataLossError(
            absl::StrCat(id, ": wrong bytes in layer ", h.layer, " head ", h.kv_head));
      }
    }
    return absl::OkStatus();
  }

  std::string dir_;
  std::vector<std::unique_ptr<testing::KvcachedProcess>> shards_;
  std::unique_ptr<ClusterClient> cluster_;
};

TEST_F(ClusterTest, SequencesSpreadEvenlyAndEachIsServedByTheShardItsIdNames) {
  StartCluster(3);
  const int n = kSanitized ? 600 : 3000;
  std::map<std::string, int> per_shard;
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    auto info = cluster_->CreateSequence({});
    ASSERT_TRUE(info.ok()) << info.status();
    ++per_shard[ShardOf(info->sequence_id)];
    ids.push_back(info->sequence_id);
  }
  ASSERT_EQ(per_shard.size(), 3u);
  // Ids are random, so each shard's count is binomial(n, 1/3): allow 5 standard deviations
  // (a chance failure ~1e-6; 2.6 of them, the old 15% at n = 600, failed about one run in
  // 30). A 2:1:1 placement is off by 9 of them at n = 600, 20 at n = 3000.
  const double sd = std::sqrt(n * (1.0 / 3) * (2.0 / 3));
  for (const auto& [shard, count] : per_shard) {
    EXPECT_NEAR(count, n / 3.0, 5 * sd) << shard;
  }
  // Each shard holds exactly the sequences whose ids name it.
  for (const ShardStatus& s : cluster_->Shards()) {
    auto shard_client = cluster_->EndpointClient(s.address);
    ASSERT_TRUE(shard_client.ok());
    ListSequencesOptions all;
    all.limit = 10000;
    auto listed = kvc::client::AdminClient::Over(**shard_client).ListSequences(all);
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_EQ(listed->total, per_shard[s.shard]) << s.shard;
    for (const SequenceInfo& seq : listed->sequences) EXPECT_EQ(ShardOf(seq.sequence_id), s.shard);
  }
  // Bytes written through the cluster come back from the same shard, exactly.
  for (int i = 0; i < 30; ++i) {
    auto id = CreateFilled();
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_TRUE(FetchAndCheck(*id).ok());
    ids.push_back(*id);
  }
  for (const std::string& id : ids) ASSERT_TRUE(cluster_->Release(id).ok()) << id;
  // An id that is not a cluster id is refused before any call.
  EXPECT_EQ(cluster_->GetSequence("s-0123456789abcdef").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// FetchInto through the cluster client lands each sequence's KV in the engine's buffers,
// read from its own shard's mapped pool (every shard here is on this node).
TEST_F(ClusterTest, FetchIntoReadsEachSequencesShardOnThisNode) {
  StartCluster(3, {}, 10, /*local_sockets=*/true);
  const std::vector<std::string> ids = FillMany(12);
  constexpr int64_t kCapacity = kTokens + 5;
  const size_t lane_bytes = static_cast<size_t>(kCapacity) * kDim * 2;
  std::map<std::string, int> per_shard;
  for (const std::string& id : ids) {
    ASSERT_FALSE(id.empty());
    std::vector<std::string> keys(kLayers, std::string(kHeads * lane_bytes, '\x5a'));
    std::vector<std::string> values = keys;
    std::vector<LayerBuffers> buffers;
    buffers.reserve(kLayers);
    for (int layer = 0; layer < kLayers; ++layer) {
      buffers.push_back({layer, keys[static_cast<size_t>(layer)].data(),
                         values[static_cast<size_t>(layer)].data(), kCapacity});
    }
    FetchIntoOptions options;
    options.dtype = DType::kF16;
    options.num_kv_heads = kHeads;
    options.head_dim = kDim;
    auto result = cluster_->FetchInto(id, buffers, options);
    ASSERT_TRUE(result.ok()) << id << ": " << result.status();
    EXPECT_EQ(result->visible_tokens, kTokens);
    EXPECT_EQ(result->lane_tokens, std::vector<int64_t>(kLayers * kHeads, kTokens));
    for (int layer = 0; layer < kLayers; ++layer) {
      for (int h = 0; h < kHeads; ++h) {
        const size_t at = static_cast<size_t>(h) * lane_bytes;
        const size_t rows = static_cast<size_t>(kTokens) * kDim * 2;
        EXPECT_EQ(keys[static_cast<size_t>(layer)].substr(at, rows),
                  testing::MakeHeadKv(SeedOf(id), layer, h, 0, kTokens, kDim, kernels::DType::kF16,
                                      /*is_value=*/false))
            << id << " layer " << layer << " head " << h;
        EXPECT_EQ(values[static_cast<size_t>(layer)].substr(at, rows),
                  testing::MakeHeadKv(SeedOf(id), layer, h, 0, kTokens, kDim, kernels::DType::kF16,
                                      /*is_value=*/true))
            << id << " layer " << layer << " head " << h;
        // Rows past the lane's tokens are the caller's: untouched.
        EXPECT_EQ(keys[static_cast<size_t>(layer)].substr(at + rows, lane_bytes - rows),
                  std::string(lane_bytes - rows, '\x5a'));
      }
    }
    ++per_shard[ShardOf(id)];
  }
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (per_shard[absl::StrCat("kc-", i)] == 0) continue;  // placement left it without one
    auto client = cluster_->EndpointClient(shards_[i]->target());
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_THAT((*client)->DataPath(), HasSubstr("shared-memory (" + dir_ + "/kc-"))
        << "shard kc-" << i;
  }
}

TEST_F(ClusterTest, PlacementFollowsTheShardsWeights) {
  StartCluster(3, {1, 1, 2});
  const int n = kSanitized ? 800 : 3000;
  std::map<std::string, int> per_shard;
  for (int i = 0; i < n; ++i) {
    auto info = cluster_->CreateSequence({});
    ASSERT_TRUE(info.ok()) << info.status();
    ++per_shard[ShardOf(info->sequence_id)];
  }
  // New ids are random, so the counts are binomial: five standard deviations keep a correct
  // placement from failing (p ~ 1e-6) while an unweighted one (kc-0 at n / 3) still fails.
  const auto near = [n](double p) { return 5.0 * std::sqrt(n * p * (1.0 - p)); };
  EXPECT_NEAR(per_shard["kc-0"], n / 4.0, near(0.25));
  EXPECT_NEAR(per_shard["kc-1"], n / 4.0, near(0.25));
  EXPECT_NEAR(per_shard["kc-2"], n / 2.0, near(0.5));
  // The placement function itself is deterministic: over fixed keys the shares must be tight.
  std::map<std::string, int> by_key;
  const int keys = 20000;
  for (int i = 0; i < keys; ++i) {
    auto where = cluster_->PlacementOf(absl::StrCat("key-", i));
    ASSERT_TRUE(where.ok()) << where.status();
    ++by_key[*where];
  }
  EXPECT_NEAR(by_key["kc-0"], keys / 4.0, 0.03 * keys / 4.0);
  EXPECT_NEAR(by_key["kc-1"], keys / 4.0, 0.03 * keys / 4.0);
  EXPECT_NEAR(by_key["kc-2"], keys / 2.0, 0.03 * keys / 2.0);
  // A client-chosen id is its own placement key: the same id goes to the same shard.
  auto where = cluster_->PlacementOf("doc-42");
  ASSERT_TRUE(where.ok());
  CreateSequenceOptions named;
  named.client_sequence_id = "doc-42";
  auto info = cluster_->CreateSequence(named);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(ShardOf(info->sequence_id), *where);
}

TEST_F(ClusterTest, AShardKilledUnderLoadFailsOnlyItsOwnSequencesAndRejoinsEmptyAfterRestart) {
  StartCluster(3);
  // Sequences that exist before the kill, on every shard.
  const std::vector<std::string> before = FillMany(30);
  ASSERT_FALSE(HasFailure());
  const std::string victim = "kc-1";
  std::atomic<bool> stop{false};
  std::atomic<bool> killed{false};
  std::mutex mu;
  std::vector<std::string> failures;  // anything a user must never see
  std::map<std::string, int> created_after_kill;
  int victim_unavailable = 0, cycles = 0;

  auto loader = [&] {
    while (!stop.load()) {
      const bool after_kill = killed.load();
      auto id = CreateFilled();
      if (!id.ok()) {
        // A create never fails while two shards serve: it moves on from a dead one. Its
        // appends may hit the kill if it was placed on the victim just before.
        std::lock_guard<std::mutex> lock(mu);
        if (id.status().code() != absl::StatusCode::kUnavailable || !killed.load()) {
          failures.push_back(absl::StrCat("create+append: ", id.status().ToString()));
        } else {
          ++victim_unavailable;
        }
        continue;
      }
      const std::string shard = ShardOf(*id);
      const absl::Status checked = FetchAndCheck(*id);
      const absl::Status released = checked.ok() ? cluster_->Release(*id).status() : checked;
      std::lock_guard<std::mutex> lock(mu);
      ++cycles;
      if (after_kill) ++created_after_kill[shard];
      for (const absl::Status& s : {checked, released}) {
        if (s.ok()) continue;
        // Only the victim's sequences may fail, and only as UNAVAILABLE (never wrong bytes).
        if (shard == victim && killed.load() && s.code() == absl::StatusCode::kUnavailable) {
          ++victim_unavailable;
        } else {
          failures.push_back(absl::StrCat(shard, ": ", s.ToString()));
        }
      }
    }
  };
  const int loaders = kSanitized ? 2 : 4;
  std::vector<std::thread> threads;
  threads.reserve(loaders);
  for (int i = 0; i < loaders; ++i) threads.emplace_back(loader);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  // The flag goes up first: a loader may see the victim's UNAVAILABLE before Kill() returns.
  killed = true;
  shards_[1]->Kill();  // kill -9
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  stop = true;
  for (auto& t : threads) t.join();

  EXPECT_THAT(failures, ::testing::IsEmpty());
  EXPECT_GT(cycles, 20);
  // Sequences created after the kill went to the live shards only (the client saw the death
  // within milliseconds; at most the calls already in flight could pick the victim).
  EXPECT_LE(created_after_kill[victim], 4);
  EXPECT_GT(created_after_kill["kc-0"] + created_after_kill["kc-2"], 10);

  // The victim's sequences fail fast with UNAVAILABLE; the others' bytes are intact.
  for (const std::string& id : before) {
    const auto t0 = Clock::now();
    const absl::Status s = FetchAndCheck(id);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    if (ShardOf(id) == victim) {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("recompute"));
      EXPECT_LT(ms, 200) << "not fail-fast: " << s;
    } else {
      EXPECT_TRUE(s.ok()) << s;
    }
  }

  // Restarted on the same port: it rejoins, empty, with a new incarnation.
  shards_[1]->Restart();
  ASSERT_FALSE(shards_[1]->target().empty()) << shards_[1]->Log();
  const absl::Status up = cluster_->WaitForShards(3, absl::Seconds(20));
  ASSERT_TRUE(up.ok()) << up;
  for (const std::string& id : before) {
    if (ShardOf(id) != victim) continue;
    const absl::Status s = cluster_->GetSequence(id).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("restarted"));
  }
  // The restarted shard itself says the same, had a stale client sent the old id there.
  {
    std::string old_id;
    for (const std::string& id : before) {
      if (ShardOf(id) == victim) old_id = id;
    }
    ASSERT_FALSE(old_id.empty());
    ClientOptions direct_options;
    direct_options.target = shards_[1]->target();
    auto direct = KvCacheClient::Connect(direct_options);
    ASSERT_TRUE(direct.ok());
    const absl::Status s = (*direct)->GetSequence(old_id).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("restarted"));
  }
  int on_victim = 0;
  for (int i = 0; i < 60; ++i) {
    auto id = CreateFilled();
    ASSERT_TRUE(id.ok()) << id.status();
    on_victim += ShardOf(*id) == victim;
    EXPECT_TRUE(FetchAndCheck(*id).ok());
  }
  EXPECT_GT(on_victim, 5);  // ~20 expected
  for (const ShardStatus& s : cluster_->Shards()) {
    if (s.shard == victim) {
      EXPECT_EQ(s.restarts_seen, 1);
    }
  }
}

TEST_F(ClusterTest, AHungShardIsEjectedAfterItsDeadlinesAndReadmittedWithItsKvIntact) {
  StartCluster(3);
  const std::vector<std::string> ids = FillMany(24);
  ASSERT_FALSE(HasFailure());
  const std::string hung = "kc-2";
  std::string hung_id;
  for (const std::string& id : ids) {
    if (ShardOf(id) == hung) hung_id = id;
  }
  ASSERT_FALSE(hung_id.empty());

  ASSERT_TRUE(shards_[2]->Stop());
  const CallOptions short_call{absl::Milliseconds(300)};
  // Two calls run into their deadlines; that ejects the shard.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(cluster_->GetSequence(hung_id, short_call).status().code(),
              absl::StatusCode::kDeadlineExceeded);
  }
  // Ejected: the next call fails at once, saying so; new sequences avoid the shard.
  const auto t0 = Clock::now();
  const absl::Status s = cluster_->GetSequence(hung_id, short_call).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("ejected"));
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count(), 100);
  bool saw_ejected = false;
  for (const ShardStatus& st : cluster_->Shards()) {
    if (st.shard == hung) saw_ejected = st.state == ShardState::kEjected;
  }
  EXPECT_TRUE(saw_ejected);
  for (int i = 0; i < 30; ++i) {
    auto id = CreateFilled(short_call);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_NE(ShardOf(*id), hung);
  }
  // Other shards' sequences are untouched by the hang.
  for (const std::string& id : ids) {
    if (ShardOf(id) != hung) {
      EXPECT_TRUE(FetchAndCheck(id, short_call).ok()) << id;
    }
  }
  // Still stopped after the ejection time: probes keep it out.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_EQ(cluster_->GetSequence(hung_id, short_call).status().code(),
            absl::StatusCode::kUnavailable);

  shards_[2]->Signal(SIGCONT);
  const absl::Status back = cluster_->WaitForShards(3, absl::Seconds(15));
  ASSERT_TRUE(back.ok()) << back;
  // Readmitted with its sequences intact: a hang loses nothing.
  for (const std::string& id : ids) {
    if (ShardOf(id) == hung) {
      EXPECT_TRUE(FetchAndCheck(id).ok()) << id;
    }
  }
}

TEST_F(ClusterTest, ADrainingShardTakesNoNewSequencesAndFinishesItsOwnWork) {
  StartCluster(3, {}, /*grace_seconds=*/20);
  const std::vector<std::string> ids = FillMany(24);
  ASSERT_FALSE(HasFailure());
  // A long prefill in flight on kc-0 when it gets SIGTERM.
  CreateSequenceOptions long_prefill;
  long_prefill.client_sequence_id = "long-prefill";
  auto info = cluster_->CreateSequence(long_prefill);
  ASSERT_TRUE(info.ok()) << info.status();
  std::string target_shard = ShardOf(info->sequence_id);
  int victim = target_shard.back() - '0';
  auto stream = cluster_->StartAppendStream(info->sequence_id);
  const std::string& id = info->sequence_id;
  auto write = [&](int64_t start, int n) {
    absl::Status status;
    for (int layer = 0; layer < kLayers; ++layer) {
      const std::string k = testing::MakeKv(SeedOf(id), layer, start, n, kHeads, kDim,
                                            kernels::DType::kF16, /*is_value=*/false);
      const std::string v = testing::MakeKv(SeedOf(id), layer, start, n, kHeads, kDim,
                                            kernels::DType::kF16, /*is_value=*/true);
      status.Update(
          stream->Write({id, layer, start, n, DType::kF16, k.data(), v.data(), k.size()}));
    }
    return status;
  };
  ASSERT_TRUE(write(0, 16).ok());
  // Write() returns once gRPC has the message, not once the shard runs the call; a SIGTERM
  // before the shard started the stream would find nothing in flight. The first chunks being
  // visible means the stream is running there.
  const auto started_by = Clock::now() + std::chrono::seconds(10);
  int64_t visible = 0;
  while (visible < 16 && Clock::now() < started_by) {
    auto seen = cluster_->GetSequence(id);
    ASSERT_TRUE(seen.ok()) << seen.status();
    visible = seen->visible_tokens;
    if (visible < 16) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(visible, 16);
  shards_[static_cast<size_t>(victim)]->Signal(SIGTERM);
  // The watch sees NOT_SERVING: new sequences go elsewhere.
  const auto until = Clock::now() + std::chrono::seconds(5);
  bool draining = false;
  while (!draining && Clock::now() < until) {
    for (const ShardStatus& s : cluster_->Shards()) {
      if (s.shard == target_shard && s.state != ShardState::kServing) draining = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(draining);
  ExpectNewSequencesAvoid(target_shard);
  // The stream that was in flight finishes: the rest of the prefill is accepted.
  ASSERT_TRUE(write(16, 32).ok());
  auto finished = stream->Finish();
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->visible_tokens, kTokens);
  // Then the shard exits by itself, cleanly, and its sequences are UNAVAILABLE.
  EXPECT_EQ(shards_[static_cast<size_t>(victim)]->WaitExit(std::chrono::seconds(30)), 0);
  for (const std::string& seq : ids) {
    const absl::Status s = FetchAndCheck(seq);
    if (ShardOf(seq) == target_shard) {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    } else {
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

TEST_F(ClusterTest, AnOperatorDrainedShardKeepsServingItsSequencesAndTakesNewOnesAfterResume) {
  StartCluster(3);
  const std::vector<std::string> ids = FillMany(24);
  ASSERT_FALSE(HasFailure());
  // `kvcachectl drain` on kc-0: AdminService.Drain on that shard alone.
  const std::string drained = "kc-0";
  auto admin = cluster_->EndpointClient(shards_[0]->target());
  ASSERT_TRUE(admin.ok());
  auto state_of = [&](const std::string& shard) {
    for (const ShardStatus& st : cluster_->Shards()) {
      if (st.shard == shard) return st.state;
    }
    return ShardState::kConnecting;
  };
  auto wait_for_state = [&](ShardState want) {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (state_of(drained) != want && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return state_of(drained) == want;
  };
  auto drain = kvc::client::AdminClient::Over(**admin).Drain(/*resume=*/false);
  ASSERT_TRUE(drain.ok()) << drain.status();
  ASSERT_TRUE(wait_for_state(ShardState::kDraining));
  ExpectNewSequencesAvoid(drained);
  // Its own sequences are still served, after several health polls.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(state_of(drained), ShardState::kDraining);
  for (const std::string& id : ids) EXPECT_TRUE(FetchAndCheck(id).ok()) << id;

  ASSERT_TRUE(kvc::client::AdminClient::Over(**admin).Drain(/*resume=*/true).ok());
  ASSERT_TRUE(wait_for_state(ShardState::kServing));
  int on_drained = 0;
  for (int i = 0; i < 60; ++i) {
    auto other = cluster_->CreateSequence({});
    ASSERT_TRUE(other.ok()) << other.status();
    on_drained += ShardOf(other->sequence_id) == drained;
  }
  EXPECT_GT(on_drained, 5);  // ~20 expected
}

TEST_F(ClusterTest, ADnsNameFindsTheShardBehindIt) {
  StartCluster(1);
  const std::string port = shards_[0]->target().substr(shards_[0]->target().rfind(':') + 1);
  ClusterOptions options;
  options.dns_name = "localhost:" + port;  // 127.0.0.1 (and ::1, where kvcached does not listen)
  options.resolve_interval = absl::Milliseconds(200);
  auto by_dns = ClusterClient::Connect(options);
  ASSERT_TRUE(by_dns.ok()) << by_dns.status();
  ASSERT_TRUE((*by_dns)->WaitForShards(1, absl::Seconds(20)).ok());
  auto info = (*by_dns)->CreateSequence({});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(ShardOf(info->sequence_id), "kc-0");
  // The static-target client sees the same sequence: one shard, one id space.
  EXPECT_TRUE(cluster_->GetSequence(info->sequence_id).ok());
  bool listed = false;
  for (const ShardStatus& s : (*by_dns)->Shards()) {
    if (s.address == "127.0.0.1:" + port) listed = s.listed && s.state == ShardState::kServing;
  }
  EXPECT_TRUE(listed);

  for (const char* bad : {"localhost", "localhost:0", "localhost:http", ":50051"}) {
    ClusterOptions malformed;
    malformed.dns_name = bad;
    EXPECT_EQ(ClusterClient::Connect(malformed).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  ClusterOptions both;
  both.dns_name = "localhost:" + port;
  both.targets = {shards_[0]->target()};
  EXPECT_EQ(ClusterClient::Connect(both).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClusterStartupTest, AnInvalidShardNameStopsKvcachedAtStartup) {
  char tmpl[] = "/tmp/kvc-cluster-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  testing::KvcachedProcess bad(
      KVCACHED_PATH, dir, {"--listen=127.0.0.1:0", "--metrics_listen=off", "--shard=Kvcached_0"});
  EXPECT_TRUE(bad.target().empty());
  EXPECT_NE(bad.WaitExit(std::chrono::seconds(30)), 0);
  EXPECT_THAT(bad.Log(), HasSubstr("shard name 'Kvcached_0' is invalid"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvc::client
