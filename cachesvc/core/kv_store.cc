#include "cachesvc/core/kv_store.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cachesvc/core/host_block_pool.h"
#include "cachesvc/core/pool_options.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Create(const KvStoreOptions& options) {
  if (options.pools.empty()) {
    return absl::InvalidArgumentError("at least one pool must be configured");
  }
  if (options.max_sequences < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_sequences is ", options.max_sequences, "; expected >= 1"));
  }
  std::unique_ptr<KvStore> store(new KvStore(options));
  KVC_RETURN_IF_ERROR(
      FromKernelStatus(kernels::CreateBackend(kernels::BackendKind::kCpu, kernels::BackendOptions(),
                                              &store->backend_),
                       "creating the CPU kernel backend"));
  absl::flat_hash_set<std::string> names;
  for (const PoolOptions& pool_options : options.pools) {
    if (!names.insert(pool_options.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool name '", pool_options.name, "' is configured twice"));
    }
    KVC_ASSIGN_OR_RETURN(auto pool, HostBlockPool::Create(pool_options, store->backend_.get()));
    store->pools_.push_back(std::move(pool));
    store->evicted_.push_back(
        std::make_unique<std::array<std::atomic<int64_t>, kEvictionCauses>>());
    for (auto& counter : *store->evicted_.back()) counter.store(0);
  }
  store->id_salt_ = std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
  return store;
}

// Members go in reverse order: sequences, then pools, then the backend they point to.
KvStore::~KvStore() = default;

absl::StatusOr<BlockPool*> KvStore::FindPool(const std::string& name) const {
  if (name.empty()) return pools_.front().get();
  std::vector<std::string> names;
  for (const auto& pool : pools_) {
    if (pool->options().name == name) return pool.get();
    names.push_back(pool->options().name);
  }
  return absl::NotFoundError(
      absl::StrCat("pool '", name, "' not found; this server has: ", absl::StrJoin(names, ", ")));
}

std::string KvStore::NewSequenceId() {
  // A salted counter through a 64-bit mixer: unique per process, unguessable enough to
  // avoid accidental collisions between clients, and cheap.
  uint64_t x = id_salt_ + 0x9e3779b97f4a7c15ull * (id_counter_.fetch_add(1) + 1);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "s-";
  for (int i = 15; i >= 0; --i) id.push_back(kHex[(x >> (4 * i)) & 0xf]);
  return id;
}

absl::StatusOr<SequenceSnapshot> KvStore::CreateSequence(const CreateSequenceParams& params) {
  if (draining()) {
    return absl::UnavailableError(
        "kvcached is draining (shutting down) and takes no new sequences; create it on "
        "another instance");
  }
  KVC_ASSIGN_OR_RETURN(BlockPool * pool, FindPool(params.pool));
  if (params.tenant.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant is ", params.tenant.size(), " bytes; at most 128 are allowed"));
  }
  if (!params.client_sequence_id.empty() && !IsValidName(params.client_sequence_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_sequence_id '", params.client_sequence_id,
                     "' is invalid: use 1-128 characters from [A-Za-z0-9._:-]"));
  }
  KVC_RETURN_IF_ERROR(ValidateSpec(params.policy, pool->options().geometry, /*automatic=*/true));
  if (!params.client_sequence_id.empty() && registry_.Find(params.client_sequence_id).ok()) {
    return absl::AlreadyExistsError(absl::StrCat("sequence '", params.client_sequence_id,
                                                 "' already exists; choose another "
                                                 "client_sequence_id or Release the old one"));
  }
  if (registry_.size() >= options_.max_sequences) {
    return absl::ResourceExhaustedError(absl::StrCat("the server holds its maximum of ",
                                                     options_.max_sequences,
                                                     " sequences; release some first"));
  }
  std::string id = params.client_sequence_id.empty() ? NewSequenceId() : params.client_sequence_id;
  auto sequence =
      std::make_shared<Sequence>(std::move(id), params.tenant, pool, params.policy, NowUnixMs());
  KVC_RETURN_IF_ERROR(registry_.Insert(sequence));
  kvc::ReaderMutexLock lock(&sequence->mu());
  return SnapshotLocked(*sequence);
}

absl::StatusOr<std::shared_ptr<Sequence>> KvStore::FindLive(const std::string& id) const {
  if (id.empty()) return absl::InvalidArgumentError("sequence_id is empty");
  return registry_.Find(id);
}

absl::StatusOr<DType> KvStore::SequenceDType(const std::string& sequence_id) const {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, FindLive(sequence_id));
  return seq->pool()->options().geometry.dtype;
}

absl::StatusOr<SequenceSnapshot> KvStore::GetSequence(const std::string& sequence_id) const {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, FindLive(sequence_id));
  kvc::ReaderMutexLock lock(&seq->mu());
  if (seq->released()) {
    return absl::NotFoundError(absl::StrCat("sequence '", sequence_id, "' was released"));
  }
  return SnapshotLocked(*seq);
}

absl::StatusOr<ReleaseResult> KvStore::Release(const std::string& sequence_id) {
  return ReleaseInternal(sequence_id, /*evicted=*/false);
}

absl::StatusOr<ReleaseResult> KvStore::Evict(const std::string& sequence_id) {
  return ReleaseInternal(sequence_id, /*evicted=*/true);
}

size_t KvStore::PoolIndex(const BlockPool* pool) const {
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (pools_[i].get() == pool) return i;
  }
  KVC_CHECK(false) << "sequence of an unknown pool";
  return 0;
}

absl::StatusOr<ReleaseResult> KvStore::ReleaseInternal(const std::string& sequence_id,
                                                       bool evicted) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, FindLive(sequence_id));
  ReleaseResult result;
  {
    kvc::WriterMutexLock lock(&seq->mu());
    if (seq->released()) {
      return absl::NotFoundError(absl::StrCat("sequence '", sequence_id, "' was released"));
    }
    if (evicted) {
      (*evicted_[PoolIndex(seq->pool())])[0].fetch_add(seq->table().TotalStoredTokens() +
                                                       seq->residual().TotalStoredTokens());
    }
    for (int part = 0; part < 2; ++part) {
      BlockTable& table = part == 0 ? seq->table() : seq->residual();
      const StorageFormat format = part == 0 ? seq->format() : seq->raw_format();
      const std::vector<BlockId> blocks = table.AllBlocks();
      seq->pool()->Free(format, blocks);
      table.Clear();
      result.freed_blocks += static_cast<int64_t>(blocks.size());
      result.freed_bytes += static_cast<int64_t>(blocks.size()) *
                            static_cast<int64_t>(seq->pool()->layout(format).block_bytes);
    }
    seq->set_released();
    seq->bump_generation();
  }
  registry_.Erase(sequence_id);
  return result;
}

SequenceSnapshot SnapshotLocked(const Sequence& seq) {
  const BlockPool& pool = *seq.pool();
  const PoolGeometry& g = pool.options().geometry;
  SequenceSnapshot s;
  s.id = seq.id();
  s.storage = seq.format();
  s.policy = seq.policy();
  s.pool = pool.options().name;
  s.tenant = seq.tenant();
  s.visible_tokens = seq.visible_tokens();
  s.layer_tokens = seq.layer_tokens();
  s.stored_token_heads = seq.table().TotalStoredTokens() + seq.residual().TotalStoredTokens();
  for (int l = 0; l < g.num_layers; ++l) {
    for (int h = 0; h < g.num_kv_heads; ++h) s.stored_tokens.push_back(seq.stored_tokens(l, h));
  }
  // The low-bit part, then the raw residual (merged when both are the same format).
  for (int part = 0; part < 2; ++part) {
    const BlockTable& table = part == 0 ? seq.table() : seq.residual();
    const StorageFormat format = part == 0 ? seq.format() : seq.raw_format();
    const int64_t blocks = table.TotalBlocks();
    const int64_t bytes = blocks * static_cast<int64_t>(pool.layout(format).block_bytes);
    s.bytes += bytes;
    if (part == 1 && blocks == 0) continue;
    if (!s.bytes_by_format.empty() && s.bytes_by_format.back().format == format) {
      s.bytes_by_format.back().blocks += blocks;
      s.bytes_by_format.back().bytes += bytes;
    } else {
      s.bytes_by_format.push_back(FormatBytes{format, blocks, bytes});
    }
  }
  const int64_t dense = 2 * s.visible_tokens * g.num_layers * g.TokenLayerBytes(g.dtype);
  s.compression_ratio =
      s.bytes > 0 ? static_cast<double>(dense) / static_cast<double>(s.bytes) : 1.0;
  s.created_unix_ms = seq.created_unix_ms();
  return s;
}

std::vector<PoolSnapshot> KvStore::ListPools() const {
  std::vector<PoolSnapshot> out;
  std::vector<int64_t> counts(pools_.size(), 0);
  for (const auto& seq : registry_.All()) {
    for (size_t i = 0; i < pools_.size(); ++i) {
      if (seq->pool() == pools_[i].get()) ++counts[i];
    }
  }
  for (size_t i = 0; i < pools_.size(); ++i) {
    const BlockPool& pool = *pools_[i];
    PoolSnapshot s;
    s.options = pool.options();
    // Counted in the pool's raw format: what a new uncompressed sequence gets.
    const StorageFormat raw = kernels::RawFormatFor(pool.options().geometry.dtype);
    s.block_bytes = static_cast<int64_t>(pool.layout(raw).block_bytes);
    s.total_blocks = pool.capacity_bytes() / s.block_bytes;
    s.used_bytes = pool.used_bytes();
    s.free_blocks = (pool.capacity_bytes() - s.used_bytes) / s.block_bytes;
    s.sequences = counts[i];
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<PoolStatsSnapshot> KvStore::GetPoolStats(const std::string& pool_name) const {
  const BlockPool* only = nullptr;
  if (!pool_name.empty()) {
    KVC_ASSIGN_OR_RETURN(only, FindPool(pool_name));
  }
  PoolStatsSnapshot stats;
  stats.pool = pool_name;
  std::vector<FormatBytes> by_format(kernels::kNumStorageFormats);
  for (int f = 0; f < kernels::kNumStorageFormats; ++f) {
    by_format[static_cast<size_t>(f)].format = static_cast<StorageFormat>(f);
  }
  std::array<int64_t, kEvictionCauses> evicted{};
  for (size_t i = 0; i < pools_.size(); ++i) {
    const auto& pool = pools_[i];
    if (only != nullptr && pool.get() != only) continue;
    for (int c = 0; c < kEvictionCauses; ++c) evicted[c] += (*evicted_[i])[c].load();
    stats.capacity_bytes += pool->capacity_bytes();
    stats.used_bytes += pool->used_bytes();
    const StorageFormat raw = kernels::RawFormatFor(pool->options().geometry.dtype);
    stats.total_blocks +=
        pool->capacity_bytes() / static_cast<int64_t>(pool->layout(raw).block_bytes);
    for (int f = 0; f < kernels::kNumStorageFormats; ++f) {
      const auto format = static_cast<StorageFormat>(f);
      const int64_t used = pool->used_blocks(format);
      stats.used_blocks += used;
      FormatBytes& fb = by_format[static_cast<size_t>(f)];
      fb.blocks += used;
      fb.bytes += used * static_cast<int64_t>(pool->layout(format).block_bytes);
    }
  }
  for (const auto& seq : registry_.All()) {
    if (only != nullptr && seq->pool() != only) continue;
    kvc::ReaderMutexLock lock(&seq->mu());
    if (seq->released()) continue;
    ++stats.sequences;
    stats.visible_tokens += seq->visible_tokens();
    stats.stored_token_heads +=
        seq->table().TotalStoredTokens() + seq->residual().TotalStoredTokens();
    const PoolGeometry& g = seq->pool()->options().geometry;
    stats.dense_bytes += 2 * seq->visible_tokens() * g.num_layers * g.TokenLayerBytes(g.dtype);
  }
  for (const FormatBytes& fb : by_format) {
    if (fb.blocks > 0) stats.bytes_by_format.push_back(fb);
  }
  stats.appended_bytes_total = appended_bytes_.load(std::memory_order_relaxed);
  stats.fetched_bytes_total = fetched_bytes_.load(std::memory_order_relaxed);
  stats.evicted_token_heads.emplace_back("operator", evicted[0]);
  for (auto why : {CompressionSpec::Eviction::kStreamingLlm, CompressionSpec::Eviction::kSnapKv,
                   CompressionSpec::Eviction::kH2o}) {
    stats.evicted_token_heads.emplace_back(EvictionName(why), evicted[static_cast<int>(why)]);
  }
  return stats;
}

absl::StatusOr<SequenceList> KvStore::ListSequences(const ListSequencesParams& p) const {
  const BlockPool* only = nullptr;
  if (!p.pool.empty()) {
    KVC_ASSIGN_OR_RETURN(only, FindPool(p.pool));
  }
  if (p.limit < 0 || p.limit > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit is ", p.limit, "; expected 0..10000 (0 = 1000)"));
  }
  const int64_t limit = p.limit == 0 ? 1000 : p.limit;
  SequenceList list;
  for (const auto& seq : registry_.All()) {
    if (only != nullptr && seq->pool() != only) continue;
    if (!p.tenant.empty() && seq->tenant() != p.tenant) continue;
    kvc::ReaderMutexLock lock(&seq->mu());
    if (seq->released()) continue;
    list.sequences.push_back(SnapshotLocked(*seq));
  }
  std::sort(list.sequences.begin(), list.sequences.end(),
            [](const SequenceSnapshot& a, const SequenceSnapshot& b) {
              return std::tie(a.created_unix_ms, a.id) < std::tie(b.created_unix_ms, b.id);
            });
  list.total = static_cast<int64_t>(list.sequences.size());
  if (static_cast<int64_t>(list.sequences.size()) > limit) {
    list.sequences.resize(static_cast<size_t>(limit));
  }
  return list;
}

}  // namespace kvc::cachesvc
