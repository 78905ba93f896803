#include "cachesvc/core/ops/sequence_fork.h"

#include <array>
#include <cstdint>
#include <vector>

#include "cachesvc/core/ops/transaction.h"
#include "cachesvc/core/pool/block_reservation.h"
#include "cachesvc/core/pool/op_stage.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

// A segment whose last block is partly filled: it gets a copy of its own.
struct Tail {
  int lane = 0;
  int tier = 0;
  BlockId block = 0;
  int32_t rows = 0;
  int64_t fresh = 0;  // index into its format's reservation
};

}  // namespace

absl::Status ForkLocked(const Sequence& source, Sequence& child) {
  const SequenceStorage& st = source.storage();
  BlockPool* pool = source.pool();
  const int bt = source.geometry().block_tokens;
  const int lanes = st.num_layers() * st.num_kv_heads();
  KVC_CHECK(child.storage().stored_token_heads() == 0 && child.pool() == pool);

  // What the child will hold: whole blocks shared, last partial blocks copied.
  std::array<std::vector<BlockId>, kernels::kNumStorageFormats> shared;
  std::array<std::vector<Tail>, kernels::kNumStorageFormats> tails;
  int64_t bytes = 0;
  for (int lane = 0; lane < lanes; ++lane) {
    const std::vector<Segment>& segments = st.lane(lane);
    for (size_t tier = 0; tier < segments.size(); ++tier) {
      const Segment& s = segments[tier];
      if (s.blocks.empty()) continue;
      const size_t f = static_cast<size_t>(s.format);
      bytes += static_cast<int64_t>(s.blocks.size()) *
               static_cast<int64_t>(pool->layout(s.format).block_bytes);
      const auto rows = static_cast<int32_t>(s.size() % bt);
      const size_t whole = rows == 0 ? s.blocks.size() : s.blocks.size() - 1;
      shared[f].insert(shared[f].end(), s.blocks.begin(),
                       s.blocks.begin() + static_cast<std::ptrdiff_t>(whole));
      if (rows > 0) {
        tails[f].push_back({lane, static_cast<int>(tier), s.blocks.back(), rows,
                            static_cast<int64_t>(tails[f].size())});
      }
    }
  }

  // 1. Fresh blocks for the tails, and their records copied (nothing visible changes yet).
  std::vector<BlockReservation> reservations;
  reservations.reserve(kernels::kNumStorageFormats);
  {
    OpStage stage(pool);
    for (size_t f = 0; f < kernels::kNumStorageFormats; ++f) {
      const auto format = static_cast<StorageFormat>(f);
      reservations.emplace_back(pool, format, child.scope().tenant());
      if (tails[f].empty()) continue;
      KVC_RETURN_IF_ERROR(reservations.back().Allocate(static_cast<int64_t>(tails[f].size())));
      std::vector<BlockId> src_blocks, dst_blocks;
      std::vector<int32_t> slots;
      for (const Tail& t : tails[f]) {
        for (int32_t r = 0; r < t.rows; ++r) {
          src_blocks.push_back(t.block);
          dst_blocks.push_back(reservations.back().block(t.fresh));
          slots.push_back(r);
        }
      }
      kernels::GatherArgs a;
      a.src = a.dst = pool->arena(format);
      a.num_rows = static_cast<int32_t>(slots.size());
      a.src_blocks = stage.In(src_blocks.data(), src_blocks.size());
      a.src_slots = stage.In(slots.data(), slots.size());
      a.dst_blocks = stage.In(dst_blocks.data(), dst_blocks.size());
      a.dst_slots = stage.In(slots.data(), slots.size());
      KVC_RETURN_IF_ERROR(stage.Launch(
          "Gather (fork)", [&](kernels::StreamHandle s) { return pool->backend()->Gather(a, s); }));
    }
    KVC_RETURN_IF_ERROR(stage.Finish());
  }
  // 2. The tenant pays for everything the child holds.
  KVC_RETURN_IF_ERROR(child.account()->Reserve(child.pool_index(), pool->options().name, bytes));

  // 3. Nothing fails from here: share the whole blocks, install the copy.
  for (size_t f = 0; f < kernels::kNumStorageFormats; ++f) {
    if (!shared[f].empty())
      pool->shares().Freeze(static_cast<StorageFormat>(f), shared[f], Holder::kSequence);
  }
  SequenceStorage& mine = child.storage();
  mine = st;
  for (size_t f = 0; f < kernels::kNumStorageFormats; ++f) {
    for (const Tail& t : tails[f]) {
      Segment s = st.lane(t.lane)[static_cast<size_t>(t.tier)];
      s.blocks.back() = reservations[f].block(t.fresh);
      mine.Replace(t.lane, t.tier, std::move(s));
    }
    reservations[f].Commit();
  }
  for (int l = 0; l < st.num_layers(); ++l) child.set_layer_tokens(l, source.layer_tokens(l));
  if (source.has_scores()) child.set_has_scores();
  child.SyncUsage();
  return absl::OkStatus();
}

}  // namespace kvc::cachesvc
