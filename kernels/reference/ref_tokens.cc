// Reference write/read/gather/re-rotation of token records.
#include <cstring>
#include <vector>

#include "base/validate.h"
#include "kvc/kernels/record_codec.h"
#include "kvc/kernels/rope.h"
#include "kvc/kernels/xxh64.h"
#include "reference/reference_ops.h"

namespace kvc::kernels::reference {

void WriteTokens(const WriteTokensArgs& a) {
  const BlockLayout& l = a.arena.layout;
  const int64_t stride = internal::RowStride(a.row_stride, l.head_dim);
  std::vector<float> x(l.head_dim);
  for (int32_t r = 0; r < a.num_rows; ++r) {
    const int32_t b = a.dst_blocks[r], s = a.dst_slots[r];
    for (int j = 0; j < l.head_dim; ++j) x[j] = LoadElement(a.keys, a.dtype, r * stride + j);
    QuantizeRecord(l.format, l.head_dim, x.data(), KeyRecord(a.arena, b, s));
    for (int j = 0; j < l.head_dim; ++j) x[j] = LoadElement(a.values, a.dtype, r * stride + j);
    QuantizeRecord(l.format, l.head_dim, x.data(), ValueRecord(a.arena, b, s));
  }
}

void ReadTokens(const ReadTokensArgs& a) {
  const BlockLayout& l = a.arena.layout;
  const int64_t stride = internal::RowStride(a.row_stride, l.head_dim);
  for (int32_t r = 0; r < a.num_rows; ++r) {
    const int32_t b = a.src_blocks[r], s = a.src_slots[r];
    for (int j = 0; j < l.head_dim; ++j) {
      if (a.keys != nullptr) {
        StoreElement(a.keys, a.dtype, r * stride + j,
                     DequantizeElement(l.format, l.head_dim, KeyRecord(a.arena, b, s), j));
      }
      if (a.values != nullptr) {
        StoreElement(a.values, a.dtype, r * stride + j,
                     DequantizeElement(l.format, l.head_dim, ValueRecord(a.arena, b, s), j));
      }
    }
  }
}

void ReadRecords(const ReadRecordsArgs& a) {
  const size_t rec = a.arena.layout.record_bytes;
  for (int32_t r = 0; r < a.num_rows; ++r) {
    const int32_t b = a.src_blocks[r], s = a.src_slots[r];
    if (a.keys != nullptr)
      std::memcpy(static_cast<uint8_t*>(a.keys) + r * rec, KeyRecord(a.arena, b, s), rec);
    if (a.values != nullptr)
      std::memcpy(static_cast<uint8_t*>(a.values) + r * rec, ValueRecord(a.arena, b, s), rec);
  }
}

void ChecksumBlocks(const ChecksumBlocksArgs& a) {
  const size_t bb = a.arena.layout.block_bytes;
  for (int32_t i = 0; i < a.num_blocks; ++i) {
    a.checksums[i] = Xxh64(static_cast<const uint8_t*>(a.arena.base) + a.blocks[i] * bb, bb);
  }
}

void Gather(const GatherArgs& a) {
  const size_t rec = a.src.layout.record_bytes;
  for (int32_t r = 0; r < a.num_rows; ++r) {
    const int32_t sb = a.src_blocks[r], ss = a.src_slots[r];
    const int32_t db = a.dst_blocks[r], ds = a.dst_slots[r];
    std::memcpy(KeyRecord(a.dst, db, ds), KeyRecord(a.src, sb, ss), rec);
    std::memcpy(ValueRecord(a.dst, db, ds), ValueRecord(a.src, sb, ss), rec);
  }
}

void Rerotate(const RerotateArgs& a) {
  const BlockLayout& l = a.arena.layout;
  std::vector<float> x(l.head_dim);
  for (int32_t r = 0; r < a.num_rows; ++r) {
    uint8_t* rec = KeyRecord(a.arena, a.blocks[r], a.slots[r]);
    for (int j = 0; j < l.head_dim; ++j) x[j] = DequantizeElement(l.format, l.head_dim, rec, j);
    RopeRotate(a.rope, l.head_dim, a.deltas[r], x.data());
    QuantizeRecord(l.format, l.head_dim, x.data(), rec);
  }
}

}  // namespace kvc::kernels::reference
