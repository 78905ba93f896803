// KvStore::Append and KvStore::Fetch: the data path in and out of the blocks.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/kv_store.h"
#include "cachesvc/core/residual.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

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

  kvc::WriterMutexLock lock(&seq->mu());
  if (seq->released()) {
    return absl::NotFoundError(absl::StrCat("sequence '", p.sequence_id, "' was released"));
  }
  const int layer = static_cast<int>(p.layer);
  const int64_t have = seq->layer_tokens()[static_cast<size_t>(layer)];
  if (p.start_position != have) {
    return absl::FailedPreconditionError(
        absl::StrCat("append out of order for layer ", p.layer, ": start_position is ",
                     p.start_position, " but the layer has ", have,
                     " tokens; the next append of this layer must start at ", have));
  }
  if (seq->residual_limit() > 0) {
    KVC_RETURN_IF_ERROR(AppendWithResidualLocked(*seq, layer, p.start_position, p.num_tokens, dtype,
                                                 p.keys.data(), p.values.data()));
  } else {
    KVC_RETURN_IF_ERROR(AppendLowBitLocked(*seq, layer, p.start_position, p.num_tokens, dtype,
                                           p.keys.data(), p.values.data()));
  }
  seq->layer_tokens()[static_cast<size_t>(layer)] = have + p.num_tokens;
  appended_bytes_.fetch_add(2 * expected, std::memory_order_relaxed);
  KVC_RETURN_IF_ERROR(ApplyAutomaticPolicyLocked(*seq, layer));
  return AppendResult{have + p.num_tokens, seq->visible_tokens()};
}

// Appends straight into the sequence's storage format (no residual).
absl::Status KvStore::AppendLowBitLocked(Sequence& seq, int layer, int64_t start, int64_t n,
                                         DType dtype, const char* keys, const char* values) {
  BlockPool* pool = seq.pool();
  const PoolGeometry& g = pool->options().geometry;
  BlockTable& table = seq.table();
  const StorageFormat format = seq.format();
  int64_t needed = 0;
  for (int h = 0; h < g.num_kv_heads; ++h) {
    needed += table.BlocksToGrow(table.head(layer, h).tokens, n);
  }
  std::vector<BlockId> fresh;
  fresh.reserve(static_cast<size_t>(needed));
  KVC_RETURN_IF_ERROR(pool->Allocate(format, needed, &fresh));

  // Row (h, t) reads keys[t, h, :].
  const size_t rows = static_cast<size_t>(n * g.num_kv_heads);
  std::vector<int32_t> positions(rows), dst_blocks(rows), dst_slots(rows);
  size_t next_fresh = 0;
  std::vector<TokenSlot> slots;
  for (int h = 0; h < g.num_kv_heads; ++h) {
    HeadBlocks& head = table.head(layer, h);
    const int64_t grow = table.BlocksToGrow(head.tokens, n);
    for (int64_t b = 0; b < grow; ++b) head.blocks.push_back(fresh[next_fresh++]);
    const int64_t first = head.tokens;
    head.tokens += n;
    table.Slots(layer, h, first, n, &slots);
    for (int64_t t = 0; t < n; ++t) {
      const size_t row = static_cast<size_t>(h * n + t);
      positions[row] = static_cast<int32_t>(start + t);
      dst_blocks[row] = slots[static_cast<size_t>(t)].block;
      dst_slots[row] = slots[static_cast<size_t>(t)].slot;
    }
  }
  const size_t elem = kernels::DTypeSize(dtype);
  kernels::KernelStatus ks;
  for (int h = 0; h < g.num_kv_heads && ks.ok(); ++h) {
    kernels::WriteTokensArgs w;
    w.arena = pool->arena(format);
    w.num_rows = static_cast<int32_t>(n);
    w.dtype = dtype;
    w.keys = keys + static_cast<size_t>(h) * g.head_dim * elem;
    w.values = values + static_cast<size_t>(h) * g.head_dim * elem;
    w.row_stride = int64_t{g.num_kv_heads} * g.head_dim;
    w.positions = positions.data() + h * n;
    w.dst_blocks = dst_blocks.data() + h * n;
    w.dst_slots = dst_slots.data() + h * n;
    ks = pool->backend()->WriteTokens(w, kernels::StreamHandle());
  }
  // Validated inputs and fresh slots: a kernel failure here is a bug, not bad input.
  KVC_CHECK(ks.ok()) << "WriteTokens failed on validated input: " << ks.detail;
  return absl::OkStatus();
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
  const DType dtype = p.dtype_set ? p.dtype : g.dtype;

  // Plan under the lock: the tokens visible now (position < visible length) are what this
  // Fetch serves, even if appends land while it streams (they only add tokens).
  struct Piece {
    int layer, head;
    bool residual;                 // from the raw residual rather than the low-bit part
    int64_t first;                 // tokens of this head served by earlier pieces
    std::vector<int64_t> indices;  // stored indices of the tokens, in stored order
  };
  std::vector<Piece> plan;
  int64_t visible = 0;
  uint64_t generation = 0;
  StorageFormat formats[2];  // [0] the low-bit part, [1] the residual
  kernels::BlockLayout layouts[2];
  {
    kvc::ReaderMutexLock lock(&seq->mu());
    if (seq->released()) {
      return absl::NotFoundError(absl::StrCat("sequence '", p.sequence_id, "' was released"));
    }
    visible = seq->visible_tokens();
    generation = seq->generation();
    formats[0] = seq->format();
    formats[1] = seq->raw_format();
    std::vector<TokenSlot> slots;
    for (int layer : layers) {
      const int64_t limit =
          p.include_unfinished ? seq->layer_tokens()[static_cast<size_t>(layer)] : visible;
      for (int h = 0; h < g.num_kv_heads; ++h) {
        int64_t served = 0;
        for (int part = 0; part < 2; ++part) {
          const BlockTable& table = part == 0 ? seq->table() : seq->residual();
          layouts[part] = pool->layout(formats[part]);
          const int64_t token_bytes =
              p.format == FetchFormat::kStored
                  ? static_cast<int64_t>(layouts[part].record_bytes)
                  : int64_t{g.head_dim} * static_cast<int64_t>(kernels::DTypeSize(dtype));
          const int64_t per_chunk = std::max<int64_t>(1, chunk_bytes / (2 * token_bytes));
          const kernels::PagedArena arena = pool->arena(formats[part]);
          const HeadBlocks& head = table.head(layer, h);
          table.Slots(layer, h, 0, head.tokens, &slots);
          Piece piece{layer, h, part == 1, served, {}};
          for (int64_t i = 0; i < head.tokens; ++i) {
            const TokenSlot& s = slots[static_cast<size_t>(i)];
            if (*kernels::PositionPtr(arena, s.block, s.slot) >= limit) continue;
            piece.indices.push_back(i);
            if (static_cast<int64_t>(piece.indices.size()) == per_chunk) {
              plan.push_back(piece);
              piece.first += per_chunk;
              served += per_chunk;
              piece.indices.clear();
            }
          }
          served += static_cast<int64_t>(piece.indices.size());
          if (!piece.indices.empty()) plan.push_back(std::move(piece));
        }
      }
    }
  }

  std::vector<int32_t> blocks, slot_ids;
  for (size_t i = 0; i < plan.size(); ++i) {
    const Piece& piece = plan[i];
    const size_t n = piece.indices.size();
    FetchChunk chunk;
    chunk.layer = piece.layer;
    chunk.kv_head = piece.head;
    chunk.first_index = piece.first;
    chunk.num_tokens = static_cast<int>(n);
    chunk.dtype = dtype;
    const StorageFormat format = formats[piece.residual ? 1 : 0];
    const kernels::BlockLayout& layout = layouts[piece.residual ? 1 : 0];
    chunk.storage = format;
    chunk.last = i + 1 == plan.size();
    chunk.visible_tokens = visible;
    chunk.positions.resize(n);
    {
      kvc::ReaderMutexLock lock(&seq->mu());
      if (seq->released() || seq->generation() != generation) {
        return absl::AbortedError(absl::StrCat(
            "sequence '", p.sequence_id,
            "' was released or compressed while this Fetch was streaming; fetch it again"));
      }
      const HeadBlocks& head =
          (piece.residual ? seq->residual() : seq->table()).head(piece.layer, piece.head);
      blocks.resize(n);
      slot_ids.resize(n);
      for (size_t t = 0; t < n; ++t) {
        const int64_t idx = piece.indices[t];
        blocks[t] = head.blocks[static_cast<size_t>(idx / g.block_tokens)];
        slot_ids[t] = static_cast<int32_t>(idx % g.block_tokens);
      }
      const kernels::PagedArena arena = pool->arena(format);
      if (p.format == FetchFormat::kStored) {
        // Records byte for byte (host arena; a device pool copies them out instead).
        const size_t rb = layout.record_bytes;
        chunk.record_bytes = static_cast<int>(rb);
        chunk.keys.resize(n * rb);
        chunk.values.resize(n * rb);
        for (size_t t = 0; t < n; ++t) {
          std::memcpy(chunk.keys.data() + t * rb, kernels::KeyRecord(arena, blocks[t], slot_ids[t]),
                      rb);
          std::memcpy(chunk.values.data() + t * rb,
                      kernels::ValueRecord(arena, blocks[t], slot_ids[t]), rb);
          chunk.positions[t] = *kernels::PositionPtr(arena, blocks[t], slot_ids[t]);
        }
      } else {
        const size_t bytes = n * static_cast<size_t>(g.head_dim) * kernels::DTypeSize(dtype);
        chunk.keys.resize(bytes);
        chunk.values.resize(bytes);
        kernels::ReadTokensArgs r;
        r.arena = arena;
        r.num_rows = static_cast<int32_t>(n);
        r.dtype = dtype;
        r.keys = chunk.keys.data();
        r.values = chunk.values.data();
        r.positions = chunk.positions.data();
        r.src_blocks = blocks.data();
        r.src_slots = slot_ids.data();
        KVC_RETURN_IF_ERROR(FromKernelStatus(pool->backend()->ReadTokens(r, {}), "ReadTokens"));
      }
    }
    fetched_bytes_.fetch_add(static_cast<int64_t>(chunk.keys.size() + chunk.values.size()),
                             std::memory_order_relaxed);
    if (!sink(chunk)) return absl::CancelledError("the caller stopped reading the Fetch stream");
  }
  return absl::OkStatus();
}

}  // namespace kvc::cachesvc
