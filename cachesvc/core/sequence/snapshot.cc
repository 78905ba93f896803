#include "cachesvc/core/sequence/snapshot.h"

namespace kvc::cachesvc {

SequenceSnapshot SnapshotLocked(const Sequence& seq) {
  const BlockPool& pool = *seq.pool();
  const PoolGeometry& g = seq.geometry();
  const SequenceStorage& st = seq.storage();
  SequenceSnapshot s;
  s.id = seq.id();
  s.storage = st.format();
  s.policy = seq.policy();
  s.pool = pool.options().name;
  s.tenant = seq.tenant();
  s.visible_tokens = seq.visible_tokens();
  s.layer_tokens = seq.all_layer_tokens();
  s.stored_token_heads = st.stored_token_heads();
  for (int l = 0; l < g.num_layers; ++l) {
    for (int h = 0; h < g.num_kv_heads; ++h) s.stored_tokens.push_back(st.lane_tokens(l, h));
  }
  // Each format once, in tier order (the raw residual after the low-bit part).
  for (size_t t = 0; t < st.tiers().size(); ++t) {
    const StorageFormat format = st.tiers()[t].format;
    bool seen = false;
    for (const FormatBytes& fb : s.bytes_by_format) seen |= fb.format == format;
    const int64_t blocks = st.blocks(format);
    if (seen || (t > 0 && blocks == 0)) continue;
    const int64_t bytes = blocks * static_cast<int64_t>(pool.layout(format).block_bytes);
    s.bytes_by_format.push_back(FormatBytes{format, blocks, bytes});
    s.bytes += bytes;
  }
  const int64_t dense = 2 * s.visible_tokens * g.num_layers * g.TokenLayerBytes(g.dtype);
  s.compression_ratio =
      s.bytes > 0 ? static_cast<double>(dense) / static_cast<double>(s.bytes) : 1.0;
  s.created_unix_ms = seq.created_unix_ms();
  s.attached_tokens = seq.attached_tokens();
  return s;
}

}  // namespace kvc::cachesvc
