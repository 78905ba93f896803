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
  absl::flat_hash_set<std::string> names;
  for (const PoolOptions& pool_options : options.pools) {
    if (!names.insert(pool_options.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool name '", pool_options.name, "' is configured twice"));
    }
    KVC_ASSIGN_OR_RETURN(auto pool, HostBlockPool::Create(pool_options));
    store->pools_.push_back(std::move(pool));
    store->operator_evicted_.push_back(std::make_unique<std::atomic<int64_t>>(0));
  }
  store->id_salt_ = std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
  return store;
}

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
  if (!params.policy.empty()) {
    return absl::UnimplementedError(
        "compression policies are not served by this build yet; create the sequence without "
        "a policy");
  }
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
  absl::ReaderMutexLock lock(&sequence->mu());
  return SnapshotLocked(*sequence);
}

absl::StatusOr<std::shared_ptr<Sequence>> KvStore::FindLive(const std::string& id) const {
  if (id.empty()) return absl::InvalidArgumentError("sequence_id is empty");
  return registry_.Find(id);
}

absl::StatusOr<AppendResult> KvStore::Append(const AppendParams& p) {
  if (p.sequence_id.empty()) return absl::InvalidArgumentError("sequence_id is empty");
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, FindLive(p.sequence_id));
  BlockPool* pool = seq->pool();
  const PoolGeometry& g = pool->options().geometry;

  // Everything about the request itself is checked before any lock or allocation.
  if (p.layer < 0 || p.layer >= g.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", p.layer, " is out of range: pool '",
                                                   pool->options().name, "' has ", g.num_layers,
                                                   " layers (0..", g.num_layers - 1, ")"));
  }
  if (p.num_tokens < 1 || p.num_tokens > options_.max_tokens_per_append) {
    return absl::InvalidArgumentError(absl::StrCat("num_tokens is ", p.num_tokens, "; expected 1..",
                                                   options_.max_tokens_per_append,
                                                   " per append (split larger ranges)"));
  }
  if (p.start_position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("start_position is ", p.start_position, "; expected >= 0"));
  }
  if (p.start_position + p.num_tokens > int64_t{INT32_MAX}) {
    return absl::OutOfRangeError(absl::StrCat("tokens up to position ",
                                              p.start_position + p.num_tokens,
                                              " exceed the largest supported position 2^31-1"));
  }
  const DType dtype = p.dtype_set ? p.dtype : g.dtype;
  const int64_t expected = p.num_tokens * g.TokenLayerBytes(dtype);
  for (const auto& [name, data] : {std::pair<const char*, absl::string_view>{"keys", p.keys},
                                   std::pair<const char*, absl::string_view>{"values", p.values}}) {
    if (static_cast<int64_t>(data.size()) != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " has ", data.size(), " bytes; expected num_tokens ", p.num_tokens, " x ",
          g.num_kv_heads, " kv heads x head_dim ", g.head_dim, " x ", kernels::DTypeSize(dtype),
          " bytes (", kernels::DTypeName(dtype), ") = ", expected));
    }
  }

  absl::WriterMutexLock lock(&seq->mu());
  if (seq->released()) {
    return absl::NotFoundError(absl::StrCat("sequence '", p.sequence_id, "' was released"));
  }
  const size_t layer = static_cast<size_t>(p.layer);
  const int64_t have = seq->layer_tokens()[layer];
  if (p.start_position != have) {
    return absl::FailedPreconditionError(
        absl::StrCat("append out of order for layer ", p.layer, ": start_position is ",
                     p.start_position, " but the layer has ", have,
                     " tokens; the next append of this layer must start at ", have));
  }
  BlockTable& table = seq->table();
  int64_t needed = 0;
  for (int h = 0; h < g.num_kv_heads; ++h) {
    needed += table.BlocksToGrow(table.head(p.layer, h).tokens, p.num_tokens);
  }
  std::vector<BlockId> fresh;
  fresh.reserve(static_cast<size_t>(needed));
  KVC_RETURN_IF_ERROR(pool->Allocate(needed, &fresh));

  // From here nothing can fail: the append becomes visible as a whole.
  std::vector<int32_t> positions(static_cast<size_t>(p.num_tokens));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    positions[static_cast<size_t>(t)] = static_cast<int32_t>(p.start_position + t);
  }
  const int64_t head_bytes = int64_t{g.head_dim} * static_cast<int64_t>(kernels::DTypeSize(dtype));
  const int64_t token_stride = g.TokenLayerBytes(dtype);
  size_t next_fresh = 0;
  std::vector<TokenSlot> slots;
  for (int h = 0; h < g.num_kv_heads; ++h) {
    HeadBlocks& head = table.head(p.layer, h);
    const int64_t grow = table.BlocksToGrow(head.tokens, p.num_tokens);
    for (int64_t b = 0; b < grow; ++b) head.blocks.push_back(fresh[next_fresh++]);
    const int64_t first = head.tokens;
    head.tokens += p.num_tokens;
    table.Slots(p.layer, h, first, p.num_tokens, &slots);
    const auto* keys = reinterpret_cast<const uint8_t*>(p.keys.data()) + h * head_bytes;
    const auto* values = reinterpret_cast<const uint8_t*>(p.values.data()) + h * head_bytes;
    pool->WriteTokens(slots, keys, values, token_stride, dtype, positions);
  }
  seq->layer_tokens()[layer] = have + p.num_tokens;
  appended_bytes_.fetch_add(2 * expected, std::memory_order_relaxed);
  return AppendResult{have + p.num_tokens, seq->visible_tokens()};
}

absl::Status KvStore::Fetch(const FetchParams& p, const FetchSink& sink) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, FindLive(p.sequence_id));
  BlockPool* pool = seq->pool();
  const PoolGeometry& g = pool->options().geometry;
  std::vector<int> layers;
  if (p.layers.empty()) {
    for (int l = 0; l < g.num_layers; ++l) layers.push_back(l);
  }
  for (int64_t l : p.layers) {
    if (l < 0 || l >= g.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("layers contains ", l, ": pool '",
                                                     pool->options().name, "' has layers 0..",
                                                     g.num_layers - 1));
    }
    layers.push_back(static_cast<int>(l));
  }
  const int64_t chunk_bytes = p.max_chunk_bytes == 0
                                  ? kDefaultChunkBytes
                                  : std::clamp(p.max_chunk_bytes, kMinChunkBytes, kMaxChunkBytes);
  const kernels::BlockLayout& layout = pool->layout();
  const DType dtype = p.dtype_set ? p.dtype : g.dtype;
  const int64_t token_bytes =
      p.format == FetchFormat::kStored
          ? static_cast<int64_t>(layout.record_bytes)
          : int64_t{g.head_dim} * static_cast<int64_t>(kernels::DTypeSize(dtype));
  const int64_t tokens_per_chunk = std::max<int64_t>(1, chunk_bytes / (2 * token_bytes));

  // Plan under the lock: what is visible now is what this Fetch serves, even if appends
  // land while it streams (they only add tokens past the plan).
  struct Piece {
    int layer, head;
    int64_t first, n;
  };
  std::vector<Piece> plan;
  int64_t visible = 0;
  uint64_t generation = 0;
  {
    absl::ReaderMutexLock lock(&seq->mu());
    if (seq->released()) {
      return absl::NotFoundError(absl::StrCat("sequence '", p.sequence_id, "' was released"));
    }
    visible = seq->visible_tokens();
    generation = seq->generation();
    for (int layer : layers) {
      for (int h = 0; h < g.num_kv_heads; ++h) {
        // Uncompressed heads store token i at index i, so the visible prefix is served.
        const int64_t n = std::min(seq->table().head(layer, h).tokens, visible);
        for (int64_t first = 0; first < n; first += tokens_per_chunk) {
          plan.push_back(Piece{layer, h, first, std::min(tokens_per_chunk, n - first)});
        }
      }
    }
  }

  std::vector<TokenSlot> slots;
  for (size_t i = 0; i < plan.size(); ++i) {
    const Piece& piece = plan[i];
    FetchChunk chunk;
    chunk.layer = piece.layer;
    chunk.kv_head = piece.head;
    chunk.first_index = piece.first;
    chunk.num_tokens = static_cast<int>(piece.n);
    chunk.dtype = dtype;
    chunk.storage = layout.format;
    chunk.last = i + 1 == plan.size();
    chunk.visible_tokens = visible;
    chunk.positions.resize(static_cast<size_t>(piece.n));
    chunk.keys.resize(static_cast<size_t>(piece.n * token_bytes));
    chunk.values.resize(static_cast<size_t>(piece.n * token_bytes));
    {
      absl::ReaderMutexLock lock(&seq->mu());
      if (seq->released() || seq->generation() != generation) {
        return absl::AbortedError(absl::StrCat(
            "sequence '", p.sequence_id,
            "' was released or compressed while this Fetch was streaming; fetch it again"));
      }
      seq->table().Slots(piece.layer, piece.head, piece.first, piece.n, &slots);
      auto* keys = reinterpret_cast<uint8_t*>(chunk.keys.data());
      auto* values = reinterpret_cast<uint8_t*>(chunk.values.data());
      if (p.format == FetchFormat::kStored) {
        chunk.record_bytes = static_cast<int>(layout.record_bytes);
        pool->ReadRecords(slots, keys, values, chunk.positions.data());
      } else {
        pool->ReadTokens(slots, dtype, keys, values, chunk.positions.data());
      }
    }
    fetched_bytes_.fetch_add(2 * piece.n * token_bytes, std::memory_order_relaxed);
    if (!sink(chunk)) return absl::CancelledError("the caller stopped reading the Fetch stream");
  }
  return absl::OkStatus();
}

absl::StatusOr<SequenceSnapshot> KvStore::GetSequence(const std::string& sequence_id) const {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, FindLive(sequence_id));
  absl::ReaderMutexLock lock(&seq->mu());
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
    absl::WriterMutexLock lock(&seq->mu());
    if (seq->released()) {
      return absl::NotFoundError(absl::StrCat("sequence '", sequence_id, "' was released"));
    }
    if (evicted) {
      operator_evicted_[PoolIndex(seq->pool())]->fetch_add(seq->table().TotalStoredTokens());
    }
    const std::vector<BlockId> blocks = seq->table().AllBlocks();
    seq->pool()->Free(blocks);
    seq->table().Clear();
    seq->set_released();
    seq->bump_generation();
    result.freed_blocks = static_cast<int64_t>(blocks.size());
    result.freed_bytes =
        result.freed_blocks * static_cast<int64_t>(seq->pool()->layout().block_bytes);
  }
  registry_.Erase(sequence_id);
  return result;
}

SequenceSnapshot SnapshotLocked(const Sequence& seq) {
  const BlockPool& pool = *seq.pool();
  const PoolGeometry& g = pool.options().geometry;
  SequenceSnapshot s;
  s.id = seq.id();
  s.pool = pool.options().name;
  s.tenant = seq.tenant();
  s.visible_tokens = seq.visible_tokens();
  s.layer_tokens = seq.layer_tokens();
  s.stored_token_heads = seq.table().TotalStoredTokens();
  const int64_t blocks = seq.table().TotalBlocks();
  s.bytes = blocks * static_cast<int64_t>(pool.layout().block_bytes);
  s.bytes_by_format.push_back(FormatBytes{pool.layout().format, blocks, s.bytes});
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
    s.block_bytes = static_cast<int64_t>(pool.layout().block_bytes);
    s.total_blocks = pool.total_blocks();
    s.free_blocks = pool.free_blocks();
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
  int64_t operator_evicted = 0;
  for (size_t i = 0; i < pools_.size(); ++i) {
    const auto& pool = pools_[i];
    if (only != nullptr && pool.get() != only) continue;
    operator_evicted += operator_evicted_[i]->load();
    const int64_t block_bytes = static_cast<int64_t>(pool->layout().block_bytes);
    const int64_t used = pool->total_blocks() - pool->free_blocks();
    stats.capacity_bytes += pool->options().capacity_bytes;
    stats.total_blocks += pool->total_blocks();
    stats.used_blocks += used;
    stats.used_bytes += used * block_bytes;
    FormatBytes& fb = by_format[static_cast<size_t>(pool->layout().format)];
    fb.blocks += used;
    fb.bytes += used * block_bytes;
  }
  for (const auto& seq : registry_.All()) {
    if (only != nullptr && seq->pool() != only) continue;
    absl::ReaderMutexLock lock(&seq->mu());
    if (seq->released()) continue;
    ++stats.sequences;
    stats.visible_tokens += seq->visible_tokens();
    stats.stored_token_heads += seq->table().TotalStoredTokens();
    const PoolGeometry& g = seq->pool()->options().geometry;
    stats.dense_bytes += 2 * seq->visible_tokens() * g.num_layers * g.TokenLayerBytes(g.dtype);
  }
  for (const FormatBytes& fb : by_format) {
    if (fb.blocks > 0) stats.bytes_by_format.push_back(fb);
  }
  stats.appended_bytes_total = appended_bytes_.load(std::memory_order_relaxed);
  stats.fetched_bytes_total = fetched_bytes_.load(std::memory_order_relaxed);
  stats.evicted_token_heads.emplace_back("operator", operator_evicted);
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
    absl::ReaderMutexLock lock(&seq->mu());
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
