// BlockTable: per sequence, per (layer, kv head), the ordered blocks holding its stored
// tokens. Stored token i of a head lives in blocks[i / block_tokens], slot
// i % block_tokens. Plain metadata; the owning Sequence's mutex guards it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "cachesvc/core/block_pool.h"
#include "common/check.h"
#include "kvc/kernels/paged_view.h"

namespace kvc::cachesvc {

// Where one token lives: block and slot inside it.
struct TokenSlot {
  BlockId block;
  int slot;
};

struct HeadBlocks {
  std::vector<BlockId> blocks;
  int64_t tokens = 0;  // stored tokens; blocks.size() == ceil(tokens / block_tokens)
};

class BlockTable {
 public:
  BlockTable(int num_layers, int num_kv_heads, int block_tokens)
      : num_kv_heads_(num_kv_heads),
        block_tokens_(block_tokens),
        heads_(static_cast<size_t>(num_layers) * static_cast<size_t>(num_kv_heads)) {}

  HeadBlocks& head(int layer, int kv_head) { return heads_[index(layer, kv_head)]; }
  const HeadBlocks& head(int layer, int kv_head) const { return heads_[index(layer, kv_head)]; }
  int block_tokens() const { return block_tokens_; }

  // Blocks a head needs to grow from `tokens` to `tokens + n` stored tokens.
  int64_t BlocksToGrow(int64_t tokens, int64_t n) const {
    return CeilDiv(tokens + n, block_tokens_) - CeilDiv(tokens, block_tokens_);
  }

  // Slots of stored tokens [first, first + n) of one head.
  void Slots(int layer, int kv_head, int64_t first, int64_t n, std::vector<TokenSlot>* out) const {
    const HeadBlocks& h = head(layer, kv_head);
    KVC_CHECK(first >= 0 && first + n <= h.tokens) << first << "+" << n << " > " << h.tokens;
    out->clear();
    for (int64_t i = first; i < first + n; ++i) {
      out->push_back(TokenSlot{h.blocks[static_cast<size_t>(i / block_tokens_)],
                               static_cast<int>(i % block_tokens_)});
    }
  }

  int64_t TotalBlocks() const {
    int64_t n = 0;
    for (const auto& h : heads_) n += static_cast<int64_t>(h.blocks.size());
    return n;
  }
  int64_t TotalStoredTokens() const {
    int64_t n = 0;
    for (const auto& h : heads_) n += h.tokens;
    return n;
  }
  // Lane arrays of one layer (lane = kv head) for kernel ops. Valid until the table changes.
  struct LaneArrays {
    std::vector<int32_t> block_offsets;  // [num_kv_heads + 1]
    std::vector<int32_t> block_ids;
    std::vector<int32_t> num_tokens;  // [num_kv_heads]
    int32_t max_tokens = 0;
    kernels::LaneTable view() const {
      kernels::LaneTable t;
      t.num_lanes = static_cast<int32_t>(num_tokens.size());
      t.block_offsets = block_offsets.data();
      t.block_ids = block_ids.data();
      t.num_tokens = num_tokens.data();
      t.max_tokens = max_tokens;
      return t;
    }
  };
  LaneArrays Lanes(int layer) const {
    LaneArrays a;
    a.block_offsets.push_back(0);
    for (int h = 0; h < num_kv_heads_; ++h) {
      const HeadBlocks& hb = head(layer, h);
      a.block_ids.insert(a.block_ids.end(), hb.blocks.begin(), hb.blocks.end());
      a.block_offsets.push_back(static_cast<int32_t>(a.block_ids.size()));
      a.num_tokens.push_back(static_cast<int32_t>(hb.tokens));
      a.max_tokens = std::max(a.max_tokens, static_cast<int32_t>(hb.tokens));
    }
    return a;
  }
  int num_kv_heads() const { return num_kv_heads_; }
  int num_layers() const { return static_cast<int>(heads_.size()) / num_kv_heads_; }

  // Every block, for Release.
  std::vector<BlockId> AllBlocks() const {
    std::vector<BlockId> all;
    all.reserve(static_cast<size_t>(TotalBlocks()));
    for (const auto& h : heads_) all.insert(all.end(), h.blocks.begin(), h.blocks.end());
    return all;
  }
  void Clear() {
    for (auto& h : heads_) h = HeadBlocks();
  }

  static int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

 private:
  size_t index(int layer, int kv_head) const {
    return static_cast<size_t>(layer) * static_cast<size_t>(num_kv_heads_) +
           static_cast<size_t>(kv_head);
  }

  int num_kv_heads_;
  int block_tokens_;
  std::vector<HeadBlocks> heads_;  // [layer][kv_head]
};

}  // namespace kvc::cachesvc
