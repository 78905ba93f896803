// Fault injection: every mutation is all-or-nothing. A kernel backend that fails its Nth op
// and a pool that refuses its Nth allocation are slid over every step of each mutation
// (append with residual aging and an automatic policy, every kind of Compress, Attend's
// score accumulation). After each injected failure the sequence must be exactly as before
// (its stored records byte for byte, its lengths and positions) and the pool must hold
// exactly as many bytes; the same request retried without the fault must then succeed and
// leave the same state as a twin store that never saw a fault.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cachesvc/core/store/kv_store.h"
#include "gtest/gtest.h"
#include "tests/testing/forwarding_backend.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/pool_device.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::MakeKv;
using Code = absl::StatusCode;

constexpr int kLayers = 2, kHeads = 2, kQHeads = 4, kDim = 32, kBlock = 8;

// Counts data ops and fails the one numbered `fail_at` (1-based; 0 = never) without running
// it, as a real backend reports a failure: nothing written.
class FaultyBackend final : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  int64_t calls = 0;
  int64_t fail_at = 0;

  const char* name() const override { return "faulty"; }

#define KVC_FAULTY_OP(Name, Args)                                                        \
  kernels::KernelStatus Name(const kernels::Args& a, kernels::StreamHandle h) override { \
    if (++calls == fail_at) return kernels::KernelStatus::Internal("injected fault");    \
    return ForwardingBackend::Name(a, h);                                                \
  }
  KVC_FAULTY_OP(WriteTokens, WriteTokensArgs)
  KVC_FAULTY_OP(ReadTokens, ReadTokensArgs)
  KVC_FAULTY_OP(ReadRecords, ReadRecordsArgs)
  KVC_FAULTY_OP(Gather, GatherArgs)
  KVC_FAULTY_OP(Rerotate, RerotateArgs)
  KVC_FAULTY_OP(SnapKvScore, SnapKvScoreArgs)
  KVC_FAULTY_OP(AccumulateScores, AccumulateScoresArgs)
  KVC_FAULTY_OP(Select, SelectArgs)
  KVC_FAULTY_OP(DecodeAttention, DecodeAttentionArgs)
#undef KVC_FAULTY_OP
};

// Refuses its Nth allocation (1-based; 0 = never) as a full pool does.
class FaultyPool final : public BlockPool {
 public:
  explicit FaultyPool(std::unique_ptr<BlockPool> inner) : inner_(std::move(inner)) {}
  int64_t calls = 0;
  int64_t fail_at = 0;

  const PoolOptions& options() const override { return inner_->options(); }
  kernels::KernelBackend* backend() const override { return inner_->backend(); }
  kernels::KernelBackend* metadata_backend() const override { return inner_->metadata_backend(); }
  StagingPool* staging() override { return inner_->staging(); }
  kernels::BlockLayout layout(StorageFormat f) const override { return inner_->layout(f); }
  kernels::PagedArena arena(StorageFormat f) override { return inner_->arena(f); }
  int64_t capacity_bytes() const override { return inner_->capacity_bytes(); }
  int64_t used_bytes() const override { return inner_->used_bytes(); }
  int64_t used_blocks(StorageFormat f) const override { return inner_->used_blocks(f); }
  absl::Status AllocateFor(StorageFormat f, int64_t n, const std::string& owner,
                           std::vector<BlockId>* out) override {
    if (n > 0 && ++calls == fail_at) return absl::ResourceExhaustedError("injected: pool full");
    return inner_->AllocateFor(f, n, owner, out);
  }
  void Free(StorageFormat f, absl::Span<const BlockId> blocks) override { inner_->Free(f, blocks); }

 private:
  std::unique_ptr<BlockPool> inner_;
};

struct Store {
  std::unique_ptr<KvStore> store;
  FaultyBackend* backend = nullptr;
  FaultyPool* pool = nullptr;
  std::string id;
};

Store MakeStore(const CompressionSpec& policy) {
  Store s;
  PoolOptions pool;
  pool.device = testing::TestPoolDevice();
  pool.geometry = {kLayers, kHeads, kQHeads, kDim, kBlock, DType::kF16, {}};
  pool.geometry.rope.enabled = true;
  pool.geometry.rope.theta = 10000;
  pool.capacity_bytes = int64_t{8} << 20;
  KvStoreOptions o;
  o.pools.push_back(pool);
  // A quota that never binds, so every mutation also reserves and settles tenant bytes.
  o.quotas = {{"*", int64_t{1} << 40, 0, 0, 0}};
  o.hooks.wrap_backend = [&s](std::unique_ptr<kernels::KernelBackend> inner) {
    auto b = std::make_unique<FaultyBackend>(std::move(inner));
    s.backend = b.get();
    return b;
  };
  o.hooks.wrap_pool = [&s](std::unique_ptr<BlockPool> inner) {
    auto p = std::make_unique<FaultyPool>(std::move(inner));
    s.pool = p.get();
    return p;
  };
  auto store = KvStore::Create(o);
  EXPECT_TRUE(store.ok()) << store.status();
  s.store = std::move(*store);
  CreateSequenceParams c;
  c.policy = policy;
  auto seq = s.store->CreateSequence(c);
  EXPECT_TRUE(seq.ok()) << seq.status();
  s.id = seq->id;
  return s;
}

// Everything a reader can observe: every stored record byte for byte (with its position),
// the lengths, and the pool's bytes in use.
std::string Observe(Store& s) {
  std::string out;
  FetchParams f;
  f.sequence_id = s.id;
  f.format = FetchFormat::kStored;
  f.include_unfinished = true;
  const absl::Status st = s.store->Fetch(f, [&](FetchChunk& c) {
    out +=
        absl::StrCat("[", c.layer, ",", c.kv_head, ",", kernels::StorageFormatName(c.storage), "]");
    for (int i = 0; i < c.num_tokens; ++i) {
      out += absl::StrCat(c.positions[static_cast<size_t>(i)], ":");
      out += c.keys.substr(static_cast<size_t>(i) * c.record_bytes,
                           static_cast<size_t>(c.record_bytes));
      out += c.values.substr(static_cast<size_t>(i) * c.record_bytes,
                             static_cast<size_t>(c.record_bytes));
    }
    return true;
  });
  EXPECT_TRUE(st.ok()) << st;
  auto info = s.store->GetSequence(s.id);
  EXPECT_TRUE(info.ok());
  for (int64_t n : info->layer_tokens) out += absl::StrCat("|", n);
  for (int64_t n : info->stored_tokens) out += absl::StrCat("/", n);
  out += absl::StrCat("#", s.pool->used_bytes(), "#", kernels::StorageFormatName(info->storage));
  // The tenant is charged exactly the pool bytes, before and after every failure.
  const std::vector<TenantUsageSnapshot> tenants = s.store->stats().TenantUsage();
  EXPECT_EQ(tenants.size(), 1u);
  if (!tenants.empty()) {
    EXPECT_EQ(tenants[0].pool_bytes.at(0), s.pool->used_bytes()) << "tenant account drifted";
  }
  return out;
}

using Op = std::function<absl::Status(Store&)>;

absl::Status AppendAll(Store& s, int64_t start, int n) {
  for (int l = 0; l < kLayers; ++l) {
    const std::string k = MakeKv(3, l, start, n, kHeads, kDim, DType::kF16, /*is_value=*/false);
    const std::string v = MakeKv(3, l, start, n, kHeads, kDim, DType::kF16, /*is_value=*/true);
    AppendParams a;
    a.sequence_id = s.id;
    a.layer = l;
    a.start_position = start;
    a.num_tokens = n;
    a.keys = k;
    a.values = v;
    const auto r = s.store->Append(a);
    if (!r.ok()) return r.status();
  }
  return absl::OkStatus();
}

Op AppendOne(int64_t start, int n, int layer) {
  return [=](Store& s) -> absl::Status {
    const std::string k = MakeKv(3, layer, start, n, kHeads, kDim, DType::kF16, /*is_value=*/false);
    const std::string v = MakeKv(3, layer, start, n, kHeads, kDim, DType::kF16, /*is_value=*/true);
    AppendParams a;
    a.sequence_id = s.id;
    a.layer = layer;
    a.start_position = start;
    a.num_tokens = n;
    a.keys = k;
    a.values = v;
    return s.store->Append(a).status();
  };
}

std::vector<float> Queries(int n, uint32_t seed) {
  std::vector<float> q(static_cast<size_t>(n) * kQHeads * kDim);
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = static_cast<float>((i * 2654435761u + seed) % 17) / 8.0f - 1.0f;
  return q;
}

Op CompressOp(CompressionSpec spec, int queries) {
  return [=](Store& s) -> absl::Status {
    CompressParams p;
    p.sequence_id = s.id;
    p.spec = spec;
    std::vector<std::vector<float>> held;
    for (int l = 0; l < kLayers && queries > 0; ++l) {
      held.push_back(Queries(queries, 7 + static_cast<uint32_t>(l)));
      LayerQueries q;
      q.layer = l;
      q.dtype = DType::kF32;
      q.queries = absl::string_view(reinterpret_cast<const char*>(held.back().data()),
                                    held.back().size() * sizeof(float));
      auto info = s.store->GetSequence(s.id);
      for (int i = 0; i < queries; ++i)
        q.positions.push_back(static_cast<int32_t>(info->layer_tokens[0] - queries + i));
      p.queries.push_back(std::move(q));
    }
    return s.store->Compress(p).status();
  };
}

Op AttendOp(int layer) {
  return [=](Store& s) -> absl::Status {
    const std::vector<float> q = Queries(1, 11);
    auto info = s.store->GetSequence(s.id);
    AttendParams a;
    a.sequence_id = s.id;
    a.layer = layer;
    a.dtype = DType::kF32;
    a.queries =
        absl::string_view(reinterpret_cast<const char*>(q.data()), q.size() * sizeof(float));
    a.positions = {static_cast<int32_t>(info->layer_tokens[static_cast<size_t>(layer)])};
    return s.store->Attend(a).status();
  };
}

struct Case {
  const char* name;
  CompressionSpec policy;
  std::function<absl::Status(Store&)> setup;
  std::vector<Op> ops;  // each is slid over by the faults; later ones see the earlier results
};

CompressionSpec Storage(StorageFormat f, int residual) {
  CompressionSpec s;
  s.storage = f;
  s.storage_set = true;
  s.residual_tokens = residual;
  return s;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  {
    CompressionSpec p = Storage(StorageFormat::kInt8, 6);
    cases.push_back({"Int8ResidualAppends",
                     p,
                     [](Store& s) { return AppendAll(s, 0, 21); },
                     {AppendOne(21, 1, 0), AppendOne(21, 13, 1), AppendOne(22, 30, 0)}});
  }
  {
    CompressionSpec p = Storage(StorageFormat::kInt4G32, 4);
    p.eviction = CompressionSpec::Eviction::kStreamingLlm;
    p.sinks = 2;
    p.window = 12;
    p.rerotate_keys = true;
    cases.push_back({"StreamingRerotateInt4Residual",
                     p,
                     [](Store& s) { return AppendAll(s, 0, 20); },
                     {AppendOne(20, 9, 0), AppendOne(20, 1, 1), AppendOne(29, 17, 0)}});
  }
  {
    CompressionSpec snap;
    snap.eviction = CompressionSpec::Eviction::kSnapKv;
    snap.window = 4;
    snap.budget = 12;
    snap.pooling_kernel = 3;
    snap.storage = StorageFormat::kNvfp4;
    snap.storage_set = true;
    snap.residual_tokens = 3;
    cases.push_back({"SnapKvNvfp4SetsResidual",
                     CompressionSpec{},
                     [](Store& s) { return AppendAll(s, 0, 37); },
                     {CompressOp(snap, 4)}});
  }
  {
    CompressionSpec h2o;
    h2o.eviction = CompressionSpec::Eviction::kH2o;
    h2o.heavy = 5;
    h2o.recent = 6;
    CompressionSpec convert = Storage(StorageFormat::kFp8E4M3, 0);
    cases.push_back({"AttendThenH2oThenConvert",
                     Storage(StorageFormat::kInt8, 5),
                     [](Store& s) { return AppendAll(s, 0, 29); },
                     {AttendOp(0), AttendOp(1), CompressOp(h2o, 0), CompressOp(convert, 0)}});
  }
  {
    CompressionSpec h2o;
    h2o.eviction = CompressionSpec::Eviction::kH2o;
    h2o.heavy = 4;
    h2o.recent = 8;
    CompressionSpec auto_h2o = h2o;
    cases.push_back(
        {"AutomaticH2oAfterPrefillScores",
         auto_h2o,
         [](Store& s) { return AppendAll(s, 0, 20); },
         {CompressOp(h2o, 20), AppendOne(20, 10, 0), AttendOp(0), AppendOne(20, 12, 1)}});
  }
  return cases;
}

// Names the case in test output instead of dumping its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class FaultInjectionTest : public ::testing::TestWithParam<Case> {};

TEST_P(FaultInjectionTest, AnyFailedStepLeavesEverythingAsBefore) {
  const Case& c = GetParam();
  Store faulty = MakeStore(c.policy);
  Store clean = MakeStore(c.policy);
  KVC_ASSERT_OK(c.setup(faulty));
  KVC_ASSERT_OK(c.setup(clean));
  for (size_t k = 0; k < c.ops.size(); ++k) {
    SCOPED_TRACE(::testing::Message() << "op " << k);
    KVC_ASSERT_OK(c.ops[k](clean));
    const std::string after = Observe(clean);
    int failures = 0;
    for (int64_t n = 1;; ++n) {
      for (bool pool_fault : {false, true}) {
        SCOPED_TRACE(::testing::Message() << (pool_fault ? "allocation " : "kernel op ") << n);
        const std::string before = Observe(faulty);
        faulty.backend->calls = faulty.pool->calls = 0;
        (pool_fault ? faulty.pool->fail_at : faulty.backend->fail_at) = n;
        const absl::Status st = c.ops[k](faulty);
        faulty.backend->fail_at = faulty.pool->fail_at = 0;
        if (st.ok()) {
          // n is past the op's last step: it ran whole. Compare with the twin, then undo by
          // nothing: the next n would just repeat it, so move on.
          ASSERT_EQ(Observe(faulty), after) << "the op's result differs from the twin's";
          goto next_op;
        }
        ++failures;
        ASSERT_EQ(st.code(), pool_fault ? Code::kResourceExhausted : Code::kInternal) << st;
        ASSERT_EQ(Observe(faulty), before) << "a failed op changed the sequence: " << st;
      }
    }
  next_op:
    EXPECT_GT(failures, 0) << "no fault was injected into this op";
  }
}

INSTANTIATE_TEST_SUITE_P(Mutations, FaultInjectionTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace kvc::cachesvc
