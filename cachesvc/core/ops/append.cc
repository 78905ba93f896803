#include "cachesvc/core/ops/append.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/ops/selection.h"
#include "cachesvc/core/ops/transaction.h"
#include "cachesvc/core/plan/eviction_rule.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

// The automatic policy evicts once a lane would be a whole block over what the rule keeps,
// back down to it: memory stays bounded by ceil((keeps + block_tokens) / block_tokens) blocks
// per lane and the selection runs once per block of appended tokens, not per token. H2O
// waits for scores (without them every token ranks 0 and it would keep the oldest).
bool EvictionDue(const Sequence& seq, const EvictionRule& rule, int layer, int64_t n)
    ABSL_SHARED_LOCKS_REQUIRED(seq.mu()) {
  if (!rule.evicts() || (rule.scored && !seq.has_scores())) return false;
  const SequenceStorage& st = seq.storage();
  int64_t most = 0;
  for (int h = 0; h < st.num_kv_heads(); ++h) most = std::max(most, st.lane_tokens(layer, h));
  return most + n > rule.keeps() + seq.geometry().block_tokens;
}

}  // namespace

absl::StatusOr<DType> ValidateAppend(const AppendParams& p, const PoolOptions& pool,
                                     int64_t max_tokens) {
  const PoolGeometry& g = pool.geometry;
  if (p.layer < 0 || p.layer >= g.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", p.layer, " is out of range: pool '",
                                                   pool.name, "' has ", g.num_layers,
                                                   " layers (0..", g.num_layers - 1, ")"));
  }
  if (p.num_tokens < 1 || p.num_tokens > max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("num_tokens is ", p.num_tokens, "; expected 1..",
                                                   max_tokens,
                                                   " per append (split larger ranges)"));
  }
  if (p.start_position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("start_position is ", p.start_position, "; expected >= 0"));
  }
  // Compared without forming start + n, which could overflow.
  if (p.start_position > int64_t{INT32_MAX} - p.num_tokens) {
    return absl::OutOfRangeError(absl::StrCat("start_position ", p.start_position, " + num_tokens ",
                                              p.num_tokens,
                                              " exceeds the largest supported position 2^31-1"));
  }
  if (p.on_device && pool.device == "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("keys and values are device memory but pool '",
                                                   pool.name, "' is on the host"));
  }
  if (p.on_device && !p.device.empty() && p.device != pool.device) {
    return absl::FailedPreconditionError(absl::StrCat(
        "keys and values are on ", p.device, " but the sequence's pool '", pool.name, "' is on ",
        pool.device, ": send them over a transfer of a pool on ", pool.device));
  }
  const DType dtype = p.dtype.value_or(g.dtype);
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
  return dtype;
}

absl::StatusOr<PreparedAppend> PrepareAppend(Sequence& seq, const AppendParams& p, DType dtype) {
  const int layer = static_cast<int>(p.layer);
  const int64_t have = seq.layer_tokens(layer);
  if (p.start_position != have) {
    return absl::FailedPreconditionError(
        absl::StrCat("append out of order for layer ", p.layer, ": start_position is ",
                     p.start_position, " but the layer has ", have,
                     " tokens; the next append of this layer must start at ", have));
  }
  const PoolGeometry& g = seq.geometry();
  SequenceStorage& st = seq.storage();
  std::vector<int32_t> positions(static_cast<size_t>(p.num_tokens));
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(p.start_position));
  PreparedAppend prepared;
  prepared.layer = layer;
  prepared.layer_tokens = have + p.num_tokens;
  prepared.rule = ResolveEviction(seq.policy());
  std::vector<LaneSelection> selection;
  if (EvictionDue(seq, prepared.rule, layer, p.num_tokens)) {
    KVC_ASSIGN_OR_RETURN(selection, SelectLayer(seq.pool()->metadata_backend(), st, layer,
                                                prepared.rule, positions));
  }
  prepared.tx = std::make_unique<Transaction>(seq.pool(), &st, seq.charge());
  prepared.tx->SetIncoming(IncomingRows{dtype, p.keys.data(), p.values.data(), p.keys.size(),
                                        int64_t{g.num_kv_heads} * g.head_dim, p.on_device});
  for (int h = 0; h < g.num_kv_heads; ++h) {
    LaneChange change;
    change.old = &st.lane(layer, h);
    change.tiers = st.tiers();
    change.incoming_positions = positions;
    change.shares = &seq.pool()->shares();
    if (!selection.empty()) {
      LaneSelection& sel = selection[static_cast<size_t>(h)];
      change.keep = std::move(sel.keep);
      change.delta = std::move(sel.delta);
      change.incoming_keep = std::move(sel.incoming_keep);
      change.incoming_delta = std::move(sel.incoming_delta);
      prepared.evicted += sel.evicted;
    }
    prepared.tx->AddLane(st.lane_index(layer, h), PlanLane(change, g.block_tokens),
                         int64_t{h} * g.head_dim);
  }
  // Host pools only: a device pool's ops share one staging context per transaction, and its
  // copies are not the bottleneck this relieves.
  prepared.unlocked = seq.pool()->staging() == nullptr && !prepared.tx->WritesInPlace();
  return prepared;
}

AppendResult FinishAppend(Sequence& seq, PreparedAppend& prepared) {
  prepared.tx->Commit();
  seq.set_layer_tokens(prepared.layer, prepared.layer_tokens);
  if (prepared.evicted > 0) {
    seq.usage()->evicted_token_heads[static_cast<size_t>(prepared.rule.why)].fetch_add(
        prepared.evicted, std::memory_order_relaxed);
  }
  seq.SyncUsage();
  return AppendResult{prepared.layer_tokens, seq.visible_tokens()};
}

}  // namespace kvc::cachesvc
