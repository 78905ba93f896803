#include "cachesvc/core/ops/transaction.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/pool/op_stage.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

// Row lists of one kernel op, grouped by the format whose arena it runs on.
struct Rows {
  std::vector<int32_t> src_blocks, src_slots, dst_blocks, dst_slots, deltas;
  size_t size() const { return dst_blocks.size(); }
};

}  // namespace

void Transaction::AddLane(int lane, LanePlan plan, int64_t lane_offset) {
  KVC_CHECK(!executed_);
  lanes_.push_back(Lane{lane, std::move(plan), lane_offset, {}});
}

BlockReservation& Transaction::ReservationFor(StorageFormat format) {
  for (BlockReservation& reservation : reservations_) {
    if (reservation.format() == format) return reservation;
  }
  reservations_.emplace_back(pool_, format, charge_.owner != nullptr ? *charge_.owner : "");
  return reservations_.back();
}

BlockId Transaction::Resolve(const Lane& lane, size_t segment, const BlockRef& ref) const {
  if (!ref.fresh) return ref.id;
  const StorageFormat format = lane.plan.segments[segment].tier.format;
  for (const BlockReservation& reservation : reservations_) {
    if (reservation.format() == format) return reservation.block(lane.fresh_base[segment] + ref.id);
  }
  KVC_CHECK(false) << "no reservation for a fresh block";
  return 0;
}

Transaction::~Transaction() {
  if (reserved_ != 0) charge_.account->Add(charge_.pool, -reserved_);
}

int64_t Transaction::NetBytes() const {
  int64_t net = 0;
  auto bytes_of = [&](StorageFormat format) {
    return static_cast<int64_t>(pool_->layout(format).block_bytes);
  };
  for (const Lane& l : lanes_) {
    const std::vector<Segment>& old = storage_->lane(l.lane);
    for (size_t j = 0; j < l.plan.freed.size(); ++j) {
      net -= static_cast<int64_t>(l.plan.freed[j].size()) * bytes_of(old[j].format);
    }
    for (const SegmentPlan& sp : l.plan.segments) {
      net +=
          (sp.fresh_blocks - static_cast<int64_t>(sp.transient.size())) * bytes_of(sp.tier.format);
    }
  }
  return net;
}

int64_t Transaction::StaysLeased() const {
  if (pool_->shares().pinned_blocks() == 0) return 0;
  int64_t bytes = 0;
  for (const Lane& l : lanes_) {
    const std::vector<Segment>& old = storage_->lane(l.lane);
    for (size_t j = 0; j < l.plan.freed.size(); ++j) {
      bytes += pool_->shares().LeaseOnlyIfDropped(old[j].format, l.plan.freed[j], charge_.account);
    }
  }
  return bytes;
}

bool Transaction::WritesInPlace() const {
  for (const Lane& l : lanes_) {
    for (const SegmentPlan& sp : l.plan.segments) {
      if (!sp.moves.empty() || !sp.rotations.empty()) return true;
    }
  }
  return false;
}

absl::Status Transaction::Execute() {
  KVC_CHECK(!executed_) << "a transaction executes once";
  std::array<int64_t, kernels::kNumStorageFormats> need{};
  for (Lane& l : lanes_) {
    for (const SegmentPlan& sp : l.plan.segments) {
      l.fresh_base.push_back(need[static_cast<size_t>(sp.tier.format)]);
      need[static_cast<size_t>(sp.tier.format)] += sp.fresh_blocks;
    }
  }
  if (charge_.account != nullptr) {
    // The quota counts what the tenant holds after the commit: a Compress that converts f16
    // blocks to INT4 needs both for a moment but leaves the tenant with less. A freed block a
    // lease of the tenant keeps stays on its account (lease-only), so it frees nothing here.
    net_bytes_ = NetBytes();
    const int64_t need = net_bytes_ + StaysLeased();
    if (need > 0) {
      KVC_RETURN_IF_ERROR(charge_.account->Reserve(charge_.pool, *charge_.pool_name, need));
      reserved_ = need;
    }
  }
  reservations_.reserve(kernels::kNumStorageFormats);
  for (size_t f = 0; f < kernels::kNumStorageFormats; ++f) {
    if (need[f] > 0)
      KVC_RETURN_IF_ERROR(ReservationFor(static_cast<StorageFormat>(f)).Allocate(need[f]));
  }
  {
    // Every op of the mutation on one stage: a device pool synchronizes once, here, before
    // anything is published (and, on an error, before the reservations return the fresh blocks).
    OpStage stage(pool_);
    KVC_RETURN_IF_ERROR(RunOps(stage));
    KVC_RETURN_IF_ERROR(stage.Finish());
  }
  executed_ = true;
  return absl::OkStatus();
}

absl::Status Transaction::RunOps(OpStage& stage) {
  KVC_RETURN_IF_ERROR(RunConverts(stage));
  KVC_RETURN_IF_ERROR(RunCopies(stage, &SegmentPlan::fills, "Gather (fill)"));
  KVC_RETURN_IF_ERROR(RunWrites(stage));
  KVC_RETURN_IF_ERROR(RunCopies(stage, &SegmentPlan::cow, "Gather (copy-on-write)"));
  KVC_RETURN_IF_ERROR(RunRotations(stage));
  return RunCopies(stage, &SegmentPlan::moves, "Gather (compaction)");
}

absl::Status Transaction::RunCopies(OpStage& stage, std::vector<PlannedCopy> SegmentPlan::*list,
                                    const char* what) {
  std::array<Rows, kernels::kNumStorageFormats> by_format;
  for (const Lane& l : lanes_) {
    for (size_t s = 0; s < l.plan.segments.size(); ++s) {
      const SegmentPlan& sp = l.plan.segments[s];
      Rows& rows = by_format[static_cast<size_t>(sp.tier.format)];
      for (const PlannedCopy& c : sp.*list) {
        rows.src_blocks.push_back(Resolve(l, s, c.src.block));
        rows.src_slots.push_back(c.src.slot);
        rows.dst_blocks.push_back(Resolve(l, s, c.dst.block));
        rows.dst_slots.push_back(c.dst.slot);
      }
    }
  }
  int formats = 0;
  for (size_t f = 0; f < kernels::kNumStorageFormats; ++f) {
    const Rows& rows = by_format[f];
    if (rows.size() == 0) continue;
    ++formats;
    // The in-place moves must be one op: only then does a failure leave nothing behind.
    KVC_CHECK(list != &SegmentPlan::moves || formats == 1) << "in-place moves in two arenas";
    kernels::GatherArgs a;
    a.src = a.dst = pool_->arena(static_cast<StorageFormat>(f));
    a.num_rows = static_cast<int32_t>(rows.size());
    a.src_blocks = stage.In(rows.src_blocks.data(), rows.size());
    a.src_slots = stage.In(rows.src_slots.data(), rows.size());
    a.dst_blocks = stage.In(rows.dst_blocks.data(), rows.size());
    a.dst_slots = stage.In(rows.dst_slots.data(), rows.size());
    KVC_RETURN_IF_ERROR(stage.Launch(
        what, [&](kernels::StreamHandle s) { return pool_->backend()->Gather(a, s); }));
  }
  return absl::OkStatus();
}

absl::Status Transaction::RunConverts(OpStage& stage) {
  const int d = pool_->options().geometry.head_dim;
  // One read and one write per (source format, destination format) pair.
  for (size_t from = 0; from < kernels::kNumStorageFormats; ++from) {
    for (size_t to = 0; to < kernels::kNumStorageFormats; ++to) {
      Rows rows;
      for (const Lane& l : lanes_) {
        const std::vector<Segment>& old = storage_->lane(l.lane);
        for (size_t s = 0; s < l.plan.segments.size(); ++s) {
          const SegmentPlan& sp = l.plan.segments[s];
          if (static_cast<size_t>(sp.tier.format) != to) continue;
          for (const PlannedConvert& c : sp.converts) {
            if (static_cast<size_t>(old[static_cast<size_t>(c.src_tier)].format) != from) continue;
            rows.src_blocks.push_back(c.src_block);
            rows.src_slots.push_back(c.src_slot);
            rows.dst_blocks.push_back(Resolve(l, s, c.dst.block));
            rows.dst_slots.push_back(c.dst.slot);
          }
        }
      }
      if (rows.size() == 0) continue;
      // f32 between the two ops; on a device pool it never leaves the device.
      float* keys = stage.Scratch<float>(rows.size() * static_cast<size_t>(d));
      float* values = stage.Scratch<float>(rows.size() * static_cast<size_t>(d));
      kernels::ReadTokensArgs r;
      r.arena = pool_->arena(static_cast<StorageFormat>(from));
      r.num_rows = static_cast<int32_t>(rows.size());
      r.dtype = DType::kF32;
      r.keys = keys;
      r.values = values;
      r.src_blocks = stage.In(rows.src_blocks.data(), rows.size());
      r.src_slots = stage.In(rows.src_slots.data(), rows.size());
      KVC_RETURN_IF_ERROR(stage.Launch("ReadTokens (convert)", [&](kernels::StreamHandle s) {
        return pool_->backend()->ReadTokens(r, s);
      }));
      kernels::WriteTokensArgs w;
      w.arena = pool_->arena(static_cast<StorageFormat>(to));
      w.num_rows = r.num_rows;
      w.dtype = DType::kF32;
      w.keys = keys;
      w.values = values;
      w.dst_blocks = stage.In(rows.dst_blocks.data(), rows.size());
      w.dst_slots = stage.In(rows.dst_slots.data(), rows.size());
      KVC_RETURN_IF_ERROR(stage.Launch("WriteTokens (convert)", [&](kernels::StreamHandle s) {
        return pool_->backend()->WriteTokens(w, s);
      }));
    }
  }
  return absl::OkStatus();
}

absl::Status Transaction::RunWrites(OpStage& stage) {
  const size_t elem = kernels::DTypeSize(incoming_.dtype);
  // The request's rows go to the device once, whole; each op below reads a stride of them.
  bool any = false;
  for (const Lane& l : lanes_) {
    for (const SegmentPlan& sp : l.plan.segments) any = any || !sp.writes.empty();
  }
  if (!any) return absl::OkStatus();
  const char* keys =
      incoming_.on_device ? incoming_.keys : stage.In(incoming_.keys, incoming_.bytes);
  const char* values =
      incoming_.on_device ? incoming_.values : stage.In(incoming_.values, incoming_.bytes);
  for (const Lane& l : lanes_) {
    for (size_t s = 0; s < l.plan.segments.size(); ++s) {
      const SegmentPlan& sp = l.plan.segments[s];
      const kernels::PagedArena arena =
          sp.writes.empty() ? kernels::PagedArena{} : pool_->arena(sp.tier.format);
      // One op per run of consecutive incoming rows (a stride walks the request in place).
      for (size_t begin = 0; begin < sp.writes.size();) {
        size_t end = begin + 1;
        while (end < sp.writes.size() && sp.writes[end].row == sp.writes[end - 1].row + 1) ++end;
        Rows rows;
        rows.dst_blocks.reserve(end - begin);
        rows.dst_slots.reserve(end - begin);
        for (size_t k = begin; k < end; ++k) {
          rows.dst_blocks.push_back(Resolve(l, s, sp.writes[k].dst.block));
          rows.dst_slots.push_back(sp.writes[k].dst.slot);
        }
        const size_t offset =
            static_cast<size_t>(l.lane_offset + sp.writes[begin].row * incoming_.row_stride) * elem;
        kernels::WriteTokensArgs w;
        w.arena = arena;
        w.num_rows = static_cast<int32_t>(rows.size());
        w.dtype = incoming_.dtype;
        w.keys = keys == nullptr ? nullptr : keys + offset;
        w.values = values == nullptr ? nullptr : values + offset;
        w.row_stride = incoming_.row_stride;
        w.dst_blocks = stage.In(rows.dst_blocks.data(), rows.size());
        w.dst_slots = stage.In(rows.dst_slots.data(), rows.size());
        KVC_RETURN_IF_ERROR(stage.Launch("WriteTokens", [&](kernels::StreamHandle s) {
          return pool_->backend()->WriteTokens(w, s);
        }));
        begin = end;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Transaction::RunRotations(OpStage& stage) {
  const PoolGeometry& g = pool_->options().geometry;
  std::array<Rows, kernels::kNumStorageFormats> by_format;
  for (const Lane& l : lanes_) {
    for (size_t s = 0; s < l.plan.segments.size(); ++s) {
      const SegmentPlan& sp = l.plan.segments[s];
      Rows& rows = by_format[static_cast<size_t>(sp.tier.format)];
      for (const PlannedRotation& r : sp.rotations) {
        rows.dst_blocks.push_back(Resolve(l, s, r.row.block));
        rows.dst_slots.push_back(r.row.slot);
        rows.deltas.push_back(r.delta);
      }
    }
  }
  for (size_t f = 0; f < kernels::kNumStorageFormats; ++f) {
    const Rows& rows = by_format[f];
    if (rows.size() == 0) continue;
    kernels::RerotateArgs a;
    a.arena = pool_->arena(static_cast<StorageFormat>(f));
    a.num_rows = static_cast<int32_t>(rows.size());
    a.blocks = stage.In(rows.dst_blocks.data(), rows.size());
    a.slots = stage.In(rows.dst_slots.data(), rows.size());
    a.deltas = stage.In(rows.deltas.data(), rows.size());
    a.rope.theta = static_cast<float>(g.rope.theta);
    a.rope.rotary_dim = g.rope.rotary_dim;
    a.rope.style = g.rope.style;
    KVC_RETURN_IF_ERROR(stage.Launch(
        "Rerotate", [&](kernels::StreamHandle s) { return pool_->backend()->Rerotate(a, s); }));
  }
  return absl::OkStatus();
}

void Transaction::Commit() {
  KVC_CHECK(executed_) << "Commit without a successful Execute";
  std::array<std::vector<BlockId>, kernels::kNumStorageFormats> freed;
  std::vector<uint8_t> rewritten(static_cast<size_t>(storage_->num_layers()), 0);
  for (const Lane& l : lanes_) {
    const std::vector<Segment>& old = storage_->lane(l.lane);
    for (size_t j = 0; j < l.plan.freed.size(); ++j) {
      auto& to = freed[static_cast<size_t>(old[j].format)];
      to.insert(to.end(), l.plan.freed[j].begin(), l.plan.freed[j].end());
    }
    if (l.plan.rewrites) rewritten[static_cast<size_t>(l.lane / storage_->num_kv_heads())] = 1;
  }
  if (tiers_) {
    // A new tier list applies to every lane at once.
    KVC_CHECK(static_cast<int>(lanes_.size()) == storage_->num_layers() * storage_->num_kv_heads());
    storage_->SetTiers(*std::move(tiers_));
    std::fill(rewritten.begin(), rewritten.end(), 1);
  }
  for (Lane& l : lanes_) {
    for (size_t s = 0; s < l.plan.segments.size(); ++s) {
      SegmentPlan& sp = l.plan.segments[s];
      std::vector<BlockId> blocks;
      for (const BlockRef& b : sp.blocks) blocks.push_back(Resolve(l, s, b));
      for (int32_t t : sp.transient) {
        freed[static_cast<size_t>(sp.tier.format)].push_back(Resolve(l, s, BlockRef{t, true}));
      }
      if (sp.extend) {
        storage_->Extend(l.lane, static_cast<int>(s), blocks, sp.positions, sp.scores);
      } else {
        storage_->Replace(l.lane, static_cast<int>(s),
                          Segment{sp.tier.format, std::move(blocks), std::move(sp.positions),
                                  std::move(sp.scores)});
      }
    }
  }
  for (BlockReservation& reservation : reservations_) reservation.Commit();
  if (charge_.account != nullptr) {
    // Settled exactly: the sequence's own change here, and the freed blocks that leases keep
    // by the Drop below, whatever the leases did since Execute estimated them.
    if (net_bytes_ != reserved_) charge_.account->Add(charge_.pool, net_bytes_ - reserved_);
    reserved_ = 0;
  }
  for (size_t f = 0; f < kernels::kNumStorageFormats; ++f) {
    // Shared (frozen) blocks lose one holder; the rest return to the pool.
    if (!freed[f].empty()) pool_->Drop(static_cast<StorageFormat>(f), freed[f], Holder::kSequence);
  }
  for (int layer = 0; layer < storage_->num_layers(); ++layer) {
    if (rewritten[static_cast<size_t>(layer)]) storage_->BumpGeneration(layer);
  }
}

}  // namespace kvc::cachesvc
