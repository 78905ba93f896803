// KvCacheClient::FetchInto: a sequence's dense K/V written straight into an engine's own
// buffers, through whichever data path the client decided on (data_paths.cc).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/src/client_impl.h"
#include "client/src/lease_decode.h"
#include "client/src/local_reader.h"
#include "client/src/transfer_reader.h"
#include "kvc/client/kv_cache_client.h"

namespace kvc::client {

namespace {

// What FetchInto can check before asking the server anything; the buffers' layers.
absl::StatusOr<std::vector<int32_t>> CheckBuffers(const std::vector<LayerBuffers>& buffers,
                                                  const FetchIntoOptions& options) {
  if (options.dtype != DType::kF16 && options.dtype != DType::kBF16 &&
      options.dtype != DType::kF32) {
    return absl::InvalidArgumentError("FetchInto: options.dtype must be F16, BF16 or F32");
  }
  if (options.num_kv_heads <= 0 || options.head_dim <= 0) {
    return absl::InvalidArgumentError("FetchInto: options.num_kv_heads and head_dim must be > 0");
  }
  if (buffers.empty()) return absl::InvalidArgumentError("FetchInto: no buffers");
  std::vector<int32_t> layers;
  for (const LayerBuffers& b : buffers) {
    if (b.keys == nullptr || b.values == nullptr || b.capacity_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrCat("FetchInto: the buffers of layer ", b.layer,
                                                     " need keys, values and capacity >= 0"));
    }
    if (std::find(layers.begin(), layers.end(), b.layer) != layers.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("FetchInto: layer ", b.layer, " has two buffers"));
    }
    layers.push_back(b.layer);
  }
  return layers;
}

}  // namespace

absl::StatusOr<FetchIntoResult> KvCacheClient::FetchInto(const std::string& sequence_id,
                                                         const std::vector<LayerBuffers>& buffers,
                                                         const FetchIntoOptions& options,
                                                         const CallOptions& call) {
  absl::StatusOr<std::vector<int32_t>> checked = CheckBuffers(buffers, options);
  if (!checked.ok()) return checked.status();
  const std::vector<int32_t>& layers = *checked;
  std::string why_grpc;  // set when the decided path could not serve this call
  if (const std::shared_ptr<internal::LocalReader> local = LocalPath(call); local != nullptr) {
    absl::StatusOr<Lease> lease = LeaseSequence(sequence_id, layers, absl::ZeroDuration(), call);
    if (!lease.ok()) return lease.status();
    FetchIntoResult result;
    absl::Status read = lease->device == "cpu"
                            ? local->ReadLeasedInto(*lease, buffers, options, &result)
                            : absl::UnimplementedError("device pool");
    (void)ReleaseLease(lease->lease_id, call);  // best effort: the TTL ends it otherwise
    if (read.ok()) {
      result.path = absl::StrCat("shared-memory (", local->path(), ")");
      return result;
    }
    if (!absl::IsUnimplemented(read)) return read;
    why_grpc = absl::StrCat("grpc (", read.message(), ")");
  } else if (const std::shared_ptr<internal::TransferReader> transfer = TransferPath(call);
             transfer != nullptr) {
    bool channel_failed = false;
    absl::StatusOr<internal::ReceivedBlocks> got =
        ReceiveLeased(*transfer, sequence_id, layers, call, &channel_failed);
    if (got.ok()) {
      FetchIntoResult result;
      absl::Status read =
          internal::ReadLeasedInto(got->lease, buffers, options, got->arenas(), &result);
      transfer->Recycle(*std::move(got));
      if (!read.ok()) return read;
      result.path = absl::StrCat("transfer (", transfer->where(), ")");
      return result;
    }
    if (!channel_failed) return got.status();
    why_grpc = absl::StrCat(
        "grpc (the transfer channel broke: ", absl::StatusCodeToString(got.status().code()), ": ",
        got.status().message(), ")");
  }
  // Over gRPC: the shape comes from GetSequence (a lane with no tokens sends no chunk), the
  // rows from the dense chunks, copied in as they arrive.
  absl::StatusOr<SequenceInfo> info = GetSequence(sequence_id, call);
  if (!info.ok()) return info.status();
  const size_t heads = static_cast<size_t>(options.num_kv_heads);
  if (info->layer_tokens.empty() ||
      info->stored_tokens.size() != info->layer_tokens.size() * heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the buffers are for ", options.num_kv_heads, " kv heads but the sequence has ",
        info->layer_tokens.empty() ? 0 : info->stored_tokens.size() / info->layer_tokens.size()));
  }
  const size_t row = static_cast<size_t>(options.head_dim) * (options.dtype == DType::kF32 ? 4 : 2);
  FetchIntoResult result;
  result.path = why_grpc.empty() ? DataPath() : why_grpc;
  result.lane_tokens.assign(buffers.size() * heads, 0);
  std::vector<std::vector<int32_t>> positions(options.positions ? result.lane_tokens.size() : 0);
  FetchOptions fetch;
  fetch.layers.assign(layers.begin(), layers.end());
  fetch.dtype = options.dtype;
  fetch.include_unfinished = options.include_unfinished;
  // Straight to gRPC: the same-node path, if any, was tried above.
  absl::Status status = FetchChunksOverGrpc(
      sequence_id, fetch,
      [&](FetchedChunk& chunk) -> absl::Status {
        const size_t b = static_cast<size_t>(std::find(layers.begin(), layers.end(), chunk.layer) -
                                             layers.begin());
        if (b == layers.size() || chunk.kv_head < 0 ||
            static_cast<size_t>(chunk.kv_head) >= heads) {
          return absl::InternalError(absl::StrCat("Fetch sent layer ", chunk.layer, " kv head ",
                                                  chunk.kv_head, ", which was not asked for"));
        }
        const size_t lane = b * heads + static_cast<size_t>(chunk.kv_head);
        const auto n = static_cast<size_t>(chunk.num_tokens);
        if (chunk.keys.size() != n * row || chunk.values.size() != n * row) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the buffers are for head_dim ", options.head_dim, " but the sequence has ",
              n == 0 ? 0 : chunk.keys.size() / n / (row / static_cast<size_t>(options.head_dim))));
        }
        const int64_t end = chunk.first_index + chunk.num_tokens;
        if (chunk.first_index != result.lane_tokens[lane]) {
          return absl::InternalError("Fetch chunks of a lane arrived out of order");
        }
        if (end > buffers[b].capacity_tokens) {
          return absl::OutOfRangeError(
              absl::StrCat("layer ", chunk.layer, " kv head ", chunk.kv_head, " holds more than ",
                           buffers[b].capacity_tokens, " tokens (its buffers' capacity)"));
        }
        const size_t at =
            (static_cast<size_t>(chunk.kv_head) * static_cast<size_t>(buffers[b].capacity_tokens) +
             static_cast<size_t>(chunk.first_index)) *
            row;
        std::memcpy(static_cast<char*>(buffers[b].keys) + at, chunk.keys.data(), n * row);
        std::memcpy(static_cast<char*>(buffers[b].values) + at, chunk.values.data(), n * row);
        result.lane_tokens[lane] = end;
        result.visible_tokens = chunk.visible_tokens;
        if (options.positions) {
          positions[lane].insert(positions[lane].end(), chunk.positions.begin(),
                                 chunk.positions.end());
        }
        return absl::OkStatus();
      },
      call);
  if (!status.ok()) return status;
  if (result.visible_tokens == 0) result.visible_tokens = info->visible_tokens;
  for (const std::vector<int32_t>& p : positions) {
    result.positions.insert(result.positions.end(), p.begin(), p.end());
  }
  return result;
}

}  // namespace kvc::client
