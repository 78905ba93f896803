// Decoding a lease's records from its arenas' bytes (shared-memory mapping or transferred
// blocks): the shapes Fetch and FetchInto give.
#include "client/src/lease_decode.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/decode/record_decode.h"
#include "client/src/kernel_types.h"

namespace kvc::client::internal {

namespace {

// The raw storage format whose records are exactly dense elements of `d`.
StorageFormat RawFormatOf(DType d) {
  switch (d) {
    case DType::kF32:
      return StorageFormat::kF32;
    case DType::kBF16:
      return StorageFormat::kBF16;
    default:
      return StorageFormat::kF16;
  }
}

size_t ElementBytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// How far a read of `lane` goes: positions below the visible tokens, or below its layer's
// appended tokens with include_unfinished.
int64_t LaneLimit(const Lease& lease, const LeaseLane& lane, bool include_unfinished) {
  const auto at = static_cast<size_t>(
      std::find(lease.layers.begin(), lease.layers.end(), lane.layer) - lease.layers.begin());
  return include_unfinished && at < lease.layer_tokens.size() ? lease.layer_tokens[at]
                                                              : lease.visible_tokens;
}

// Calls on_run(first, count, keys, values) for each run of the segment's tokens that lie in
// one block and below `limit`: their K (and V) records are contiguous in the arena.
template <typename OnRun>
absl::Status ForEachRun(const LeaseSegment& seg, const LeaseArena& layout, const uint8_t* base,
                        int64_t arena_bytes, size_t block_tokens, int64_t limit, OnRun on_run) {
  const size_t rb = static_cast<size_t>(layout.record_bytes);
  const size_t n = seg.positions.size();
  for (size_t t = 0; t < n;) {
    const size_t slot = t % block_tokens;
    const size_t most = std::min(block_tokens - slot, n - t);
    size_t run = 0;
    while (run < most && seg.positions[t + run] < limit) ++run;
    if (run == 0) {
      ++t;
      continue;
    }
    const int64_t block = seg.blocks[t / block_tokens];
    if (block < 0 || (block + 1) * layout.block_bytes > arena_bytes) {
      return absl::InternalError(
          absl::StrCat("lease block ", block, " is outside the ", arena_bytes, "-byte arena"));
    }
    const uint8_t* b = base + block * layout.block_bytes;
    on_run(t, run, b + layout.key_offset + slot * rb, b + layout.value_offset + slot * rb);
    t += run;
  }
  return absl::OkStatus();
}

// memcpy without `rep movsb`: glibc copies a few KiB with it, which runs ~4x slower when the
// destination sits a few bytes past the source modulo 4 KiB (measured on this AMD EPYC VM:
// a malloc'd buffer starts 16 bytes into a page, arena records start on one). Fixed 64-byte
// copies compile to vector loads and stores, as fast as memcpy at every alignment.
void CopyBytes(char* to, const uint8_t* from, size_t bytes) {
  for (; bytes >= 64; bytes -= 64, to += 64, from += 64) std::memcpy(to, from, 64);
  std::memcpy(to, from, bytes);
}

// `count` records of `format` (stride rb) as dense rows of `dtype`: copied when the format is
// that dtype's raw one, else decoded (record_decode.h).
void WriteDense(StorageFormat format, DType dtype, int d, size_t rb, const uint8_t* records,
                size_t count, char* out) {
  if (format == RawFormatOf(dtype)) {
    CopyBytes(out, records, count * rb);
    return;
  }
  // CheckDecodable (first thing in every read) made sure both are known.
  DecodeRecords(*KernelFormat(format), *KernelDType(dtype), d, rb, records, count, out);
}

// The lease must have been live for the whole read: a block of an expired lease may have been
// handed to another sequence meanwhile.
absl::Status CheckStillLeased(const Lease& lease) {
  if (absl::ToUnixMillis(absl::Now()) >= lease.expires_unix_ms) {
    return absl::AbortedError("the lease expired while it was read; fetch again");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDecodable(const Lease& lease) {
  const auto unknown = [](const char* what, int value) {
    return absl::UnimplementedError(absl::StrCat(
        "the lease holds ", what, " ", value,
        ", which this client cannot decode (a newer server?); the server decodes it over gRPC"));
  };
  if (!KernelDType(lease.dtype)) return unknown("dtype", static_cast<int>(lease.dtype));
  for (const LeaseArena& a : lease.arenas) {
    if (!KernelFormat(a.format)) return unknown("storage format", static_cast<int>(a.format));
  }
  for (const LeaseLane& lane : lease.lanes) {
    for (const LeaseSegment& seg : lane.segments) {
      if (!KernelFormat(seg.format)) {
        return unknown("storage format", static_cast<int>(seg.format));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ReadLeased(const Lease& lease, const FetchOptions& options, const ArenaLookup& arenas,
                        const std::function<absl::Status(FetchedChunk&)>& on_chunk) {
  if (absl::Status known = CheckDecodable(lease); !known.ok()) return known;
  const int d = lease.head_dim;
  const DType dtype = options.dtype == DType::kPoolDefault ? lease.dtype : options.dtype;
  const auto bt = static_cast<size_t>(lease.block_tokens);
  // One chunk, reused: its buffers keep their capacity from lane to lane (unless the caller
  // moves them out), so a large read does not fault in fresh pages for every lane.
  FetchedChunk chunk;
  for (const LeaseLane& lane : lease.lanes) {
    const int64_t limit = LaneLimit(lease, lane, options.include_unfinished);
    int64_t sent = 0;  // tokens of this lane in earlier chunks
    for (const LeaseSegment& seg : lane.segments) {
      const LeaseArena* layout = lease.arena(seg.format);
      if (layout == nullptr) return absl::InternalError("the lease names no arena for a segment");
      absl::StatusOr<ArenaView> arena = arenas(seg.format);
      if (!arena.ok()) return arena.status();
      chunk.layer = lane.layer;
      chunk.kv_head = lane.kv_head;
      chunk.storage = seg.format;
      chunk.visible_tokens = lease.visible_tokens;
      chunk.dtype = dtype;  // as gRPC: the dense dtype, also beside stored records
      const size_t rb = static_cast<size_t>(layout->record_bytes);
      const size_t out_bytes =
          options.stored_format ? rb : static_cast<size_t>(d) * ElementBytes(dtype);
      chunk.record_bytes = options.stored_format ? static_cast<int>(rb) : 0;
      chunk.positions.clear();
      chunk.keys.clear();
      chunk.values.clear();
      chunk.keys.reserve(seg.positions.size() * out_bytes);
      chunk.values.reserve(seg.positions.size() * out_bytes);
      absl::Status walked = ForEachRun(
          seg, *layout, arena->base, arena->bytes, bt, limit,
          [&](size_t t, size_t run, const uint8_t* k, const uint8_t* v) {
            chunk.positions.insert(chunk.positions.end(),
                                   seg.positions.begin() + static_cast<std::ptrdiff_t>(t),
                                   seg.positions.begin() + static_cast<std::ptrdiff_t>(t + run));
            for (const auto& [rec, out] :
                 {std::make_pair(k, &chunk.keys), std::make_pair(v, &chunk.values)}) {
              const size_t at = out->size();
              out->resize(at + run * out_bytes);
              if (options.stored_format) {
                CopyBytes(out->data() + at, rec, run * rb);
              } else {
                WriteDense(seg.format, dtype, d, rb, rec, run, out->data() + at);
              }
            }
          });
      if (!walked.ok()) return walked;
      chunk.num_tokens = static_cast<int>(chunk.positions.size());
      if (chunk.num_tokens == 0) continue;
      chunk.first_index = sent;
      sent += chunk.num_tokens;
      if (absl::Status s = CheckStillLeased(lease); !s.ok()) return s;
      if (absl::Status s = on_chunk(chunk); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ReadLeasedInto(const Lease& lease, const std::vector<LayerBuffers>& buffers,
                            const FetchIntoOptions& options, const ArenaLookup& arenas,
                            FetchIntoResult* result) {
  if (absl::Status known = CheckDecodable(lease); !known.ok()) return known;
  const int d = lease.head_dim;
  const size_t heads = static_cast<size_t>(options.num_kv_heads);
  if (d != options.head_dim || lease.layers.size() != buffers.size() ||
      lease.lanes.size() != buffers.size() * heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the buffers are for ", options.num_kv_heads, " kv heads x head_dim ", options.head_dim,
        " but the sequence has ",
        lease.layers.empty() ? 0 : lease.lanes.size() / lease.layers.size(), " x ", d));
  }
  const auto bt = static_cast<size_t>(lease.block_tokens);
  // Lane i is buffer i / heads, head i % heads (the lease lists lanes layer-major, layers in
  // request order, which is the buffers' order). Count first: nothing is written when a lane
  // does not fit.
  std::vector<int64_t> counts(lease.lanes.size(), 0);
  for (size_t i = 0; i < lease.lanes.size(); ++i) {
    const LeaseLane& lane = lease.lanes[i];
    const LayerBuffers& buffer = buffers[i / heads];
    if (lane.layer != buffer.layer || static_cast<size_t>(lane.kv_head) != i % heads) {
      return absl::InternalError("the lease's lanes are not in the requested order");
    }
    const int64_t limit = LaneLimit(lease, lane, options.include_unfinished);
    for (const LeaseSegment& seg : lane.segments) {
      counts[i] += std::count_if(seg.positions.begin(), seg.positions.end(),
                                 [limit](int32_t p) { return p < limit; });
    }
    if (counts[i] > buffer.capacity_tokens) {
      return absl::OutOfRangeError(absl::StrCat("layer ", lane.layer, " kv head ", lane.kv_head,
                                                " holds ", counts[i], " tokens; its buffers hold ",
                                                buffer.capacity_tokens));
    }
  }
  const size_t row = static_cast<size_t>(d) * ElementBytes(options.dtype);
  for (size_t i = 0; i < lease.lanes.size(); ++i) {
    const LeaseLane& lane = lease.lanes[i];
    const LayerBuffers& buffer = buffers[i / heads];
    const size_t lane_offset = (i % heads) * static_cast<size_t>(buffer.capacity_tokens) * row;
    char* keys = static_cast<char*>(buffer.keys) + lane_offset;
    char* values = static_cast<char*>(buffer.values) + lane_offset;
    const int64_t limit = LaneLimit(lease, lane, options.include_unfinished);
    size_t written = 0;
    for (const LeaseSegment& seg : lane.segments) {
      const LeaseArena* layout = lease.arena(seg.format);
      if (layout == nullptr) return absl::InternalError("the lease names no arena for a segment");
      absl::StatusOr<ArenaView> arena = arenas(seg.format);
      if (!arena.ok()) return arena.status();
      const size_t rb = static_cast<size_t>(layout->record_bytes);
      absl::Status walked = ForEachRun(
          seg, *layout, arena->base, arena->bytes, bt, limit,
          [&](size_t t, size_t run, const uint8_t* k, const uint8_t* v) {
            WriteDense(seg.format, options.dtype, d, rb, k, run, keys + written * row);
            WriteDense(seg.format, options.dtype, d, rb, v, run, values + written * row);
            if (options.positions) {
              result->positions.insert(
                  result->positions.end(), seg.positions.begin() + static_cast<std::ptrdiff_t>(t),
                  seg.positions.begin() + static_cast<std::ptrdiff_t>(t + run));
            }
            written += run;
          });
      if (!walked.ok()) return walked;
    }
    result->lane_tokens.push_back(static_cast<int64_t>(written));
  }
  result->visible_tokens = lease.visible_tokens;
  return CheckStillLeased(lease);
}

}  // namespace kvc::client::internal
