#include "client/device/device_decode.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/src/kernel_types.h"
#include "kvc/kernels/block_layout.h"

namespace kvc::client::internal {

absl::Status FromKernel(const kernels::KernelStatus& ks, const std::string& what) {
  if (ks.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", ks.detail);
  switch (ks.code) {
    case kernels::KernelStatusCode::kInvalidArgument:
      return absl::InvalidArgumentError(message);
    case kernels::KernelStatusCode::kUnavailable:
    case kernels::KernelStatusCode::kUnsupported:
      return absl::FailedPreconditionError(message);
    case kernels::KernelStatusCode::kOutOfMemory:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<std::vector<int32_t>> CheckDeviceBuffers(const std::vector<LayerBuffers>& buffers,
                                                        const FetchIntoOptions& options) {
  if (options.dtype != DType::kF16 && options.dtype != DType::kBF16 &&
      options.dtype != DType::kF32) {
    return absl::InvalidArgumentError("FetchInto: options.dtype must be F16, BF16 or F32");
  }
  if (options.num_kv_heads <= 0 || options.head_dim <= 0 || buffers.empty()) {
    return absl::InvalidArgumentError(
        "FetchInto: num_kv_heads, head_dim and the buffers must be given");
  }
  std::vector<int32_t> layers;
  for (const LayerBuffers& b : buffers) {
    if (b.keys == nullptr || b.values == nullptr || b.capacity_tokens < 0 ||
        std::find(layers.begin(), layers.end(), b.layer) != layers.end()) {
      return absl::InvalidArgumentError(absl::StrCat("FetchInto: the buffers of layer ", b.layer,
                                                     " are missing, negative or repeated"));
    }
    layers.push_back(b.layer);
  }
  return layers;
}

namespace {

size_t ElementBytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// The lease's description of `format`'s records, checked against the layout this client's
// kernels compute (the reads below trust it for every offset).
absl::StatusOr<kernels::BlockLayout> CheckedLayout(const Lease& lease, StorageFormat format) {
  const LeaseArena* a = lease.arena(format);
  if (a == nullptr) return absl::InternalError("the lease names no arena for a segment");
  const std::optional<kernels::StorageFormat> known = internal::KernelFormat(format);
  if (!known) {
    return absl::UnimplementedError(
        absl::StrCat("the lease holds storage format ", static_cast<int>(format),
                     ", which this client cannot decode (a newer server?)"));
  }
  const kernels::BlockLayout l =
      kernels::MakeBlockLayout(*known, lease.head_dim, lease.block_tokens);
  if (static_cast<int64_t>(l.block_bytes) != a->block_bytes ||
      static_cast<int64_t>(l.record_bytes) != a->record_bytes ||
      static_cast<int64_t>(l.key_offset) != a->key_offset ||
      static_cast<int64_t>(l.value_offset) != a->value_offset) {
    return absl::InternalError(
        absl::StrCat("the server's layout of ", kernels::StorageFormatName(l.format),
                     " records differs from this client's (a different kvcache version?)"));
  }
  return l;
}

// A stream of one call, destroyed with it (after its work was synchronized or abandoned).
class Stream {
 public:
  explicit Stream(kernels::KernelBackend* backend) : backend_(backend) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (created_) {
      (void)backend_->Synchronize(handle_);
      backend_->DestroyStream(handle_);
    }
  }
  kernels::KernelStatus Create() {
    const kernels::KernelStatus ks = backend_->CreateStream(&handle_);
    created_ = ks.ok();
    return ks;
  }
  kernels::StreamHandle handle() const { return handle_; }

 private:
  kernels::KernelBackend* backend_;
  kernels::StreamHandle handle_;
  bool created_ = false;
};

// One run of ReadTokens: `rows` rows of one lane's segment, from row `first` of the call's
// (block, slot) arrays, written at row `out_row` of the lane's buffers.
struct Piece {
  size_t lane = 0;
  StorageFormat format = StorageFormat::kPoolDefault;
  size_t first = 0;
  size_t rows = 0;
  size_t out_row = 0;
};

}  // namespace

absl::StatusOr<FetchIntoResult> DecodeOnDevice(
    const Lease& lease, const std::function<DeviceArena(StorageFormat)>& arena_of,
    kernels::KernelBackend* backend, const std::vector<LayerBuffers>& buffers,
    const FetchIntoOptions& options) {
  const size_t heads = static_cast<size_t>(options.num_kv_heads);
  if (lease.head_dim != options.head_dim || lease.layers.size() != buffers.size() ||
      lease.lanes.size() != buffers.size() * heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("the buffers are for ", options.num_kv_heads, " kv heads x head_dim ",
                     options.head_dim, " but the sequence has ",
                     lease.layers.empty() ? 0 : lease.lanes.size() / lease.layers.size(), " x ",
                     lease.head_dim));
  }
  // Every lane's rows, counted (and checked against the buffers) before anything is written.
  const auto bt = static_cast<size_t>(lease.block_tokens);
  std::vector<int32_t> blocks;
  std::vector<int32_t> slots;
  std::vector<Piece> pieces;
  FetchIntoResult result;
  result.lane_tokens.assign(lease.lanes.size(), 0);
  std::map<StorageFormat, kernels::BlockLayout> layouts;
  for (size_t i = 0; i < lease.lanes.size(); ++i) {
    const LeaseLane& lane = lease.lanes[i];
    const LayerBuffers& buffer = buffers[i / heads];
    if (lane.layer != buffer.layer || static_cast<size_t>(lane.kv_head) != i % heads) {
      return absl::InternalError("the lease's lanes are not in the requested order");
    }
    const auto at = static_cast<size_t>(
        std::find(lease.layers.begin(), lease.layers.end(), lane.layer) - lease.layers.begin());
    const int64_t limit = options.include_unfinished && at < lease.layer_tokens.size()
                              ? lease.layer_tokens[at]
                              : lease.visible_tokens;
    for (const LeaseSegment& seg : lane.segments) {
      if (layouts.count(seg.format) == 0) {
        absl::StatusOr<kernels::BlockLayout> l = CheckedLayout(lease, seg.format);
        if (!l.ok()) return l.status();
        layouts[seg.format] = *l;
      }
      const auto block_bytes = static_cast<int64_t>(layouts[seg.format].block_bytes);
      Piece piece{i, seg.format, blocks.size(), 0, static_cast<size_t>(result.lane_tokens[i])};
      for (size_t t = 0; t < seg.positions.size(); ++t) {
        if (seg.positions[t] >= limit) continue;
        const int32_t block = t / bt < seg.blocks.size() ? seg.blocks[t / bt] : -1;
        if (block < 0 || block >= arena_of(seg.format).num_blocks) {
          return absl::InternalError(absl::StrCat("lease block ", block, " of ", block_bytes,
                                                  " bytes is outside pool '", lease.pool, "'"));
        }
        blocks.push_back(block);
        slots.push_back(static_cast<int32_t>(t % bt));
        if (options.positions) result.positions.push_back(seg.positions[t]);
        ++piece.rows;
      }
      result.lane_tokens[i] += static_cast<int64_t>(piece.rows);
      if (piece.rows > 0) pieces.push_back(piece);
    }
    if (result.lane_tokens[i] > buffer.capacity_tokens) {
      return absl::OutOfRangeError(absl::StrCat(
          "layer ", lane.layer, " kv head ", lane.kv_head, " holds ", result.lane_tokens[i],
          " tokens; its buffers hold ", buffer.capacity_tokens));
    }
  }
  result.visible_tokens = lease.visible_tokens;
  if (blocks.empty()) return result;

  // The (block, slot) arrays go to the device once; then one ReadTokens per piece, all on
  // one stream, and one wait.
  Scratch rows(backend);  // declared first: freed after the stream's work is waited for
  Stream stream(backend);
  KVC_RETURN_IF_KERNEL_ERROR(stream.Create(), "FetchInto: no CUDA stream");
  const size_t n = blocks.size();
  KVC_RETURN_IF_KERNEL_ERROR(rows.Allocate(2 * n * sizeof(int32_t)),
                             "FetchInto: no device memory for the block tables");
  auto* dev_blocks = static_cast<int32_t*>(rows.get());
  int32_t* dev_slots = dev_blocks + n;
  KVC_RETURN_IF_KERNEL_ERROR(
      backend->CopyToDevice(dev_blocks, blocks.data(), n * sizeof(int32_t), stream.handle()),
      "FetchInto: uploading the block tables");
  KVC_RETURN_IF_KERNEL_ERROR(
      backend->CopyToDevice(dev_slots, slots.data(), n * sizeof(int32_t), stream.handle()),
      "FetchInto: uploading the block tables");
  const size_t row = static_cast<size_t>(options.head_dim) * ElementBytes(options.dtype);
  for (const Piece& p : pieces) {
    const LayerBuffers& buffer = buffers[p.lane / heads];
    const size_t lane_offset = (p.lane % heads) * static_cast<size_t>(buffer.capacity_tokens) * row;
    kernels::ReadTokensArgs a;
    const DeviceArena arena = arena_of(p.format);
    a.arena.base = const_cast<void*>(arena.base);
    a.arena.layout = layouts[p.format];
    a.arena.num_blocks = static_cast<int32_t>(std::min<int64_t>(arena.num_blocks, INT32_MAX));
    a.num_rows = static_cast<int32_t>(p.rows);
    a.dtype = *internal::KernelDType(options.dtype);  // F16, BF16 or F32: CheckDeviceBuffers
    a.keys = static_cast<char*>(buffer.keys) + lane_offset + p.out_row * row;
    a.values = static_cast<char*>(buffer.values) + lane_offset + p.out_row * row;
    a.src_blocks = dev_blocks + p.first;
    a.src_slots = dev_slots + p.first;
    KVC_RETURN_IF_KERNEL_ERROR(backend->ReadTokens(a, stream.handle()),
                               "FetchInto: reading records on the device");
  }
  KVC_RETURN_IF_KERNEL_ERROR(backend->Synchronize(stream.handle()),
                             "FetchInto: reading records on the device");
  return result;
}

}  // namespace kvc::client::internal
