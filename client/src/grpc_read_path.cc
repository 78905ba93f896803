// The gRPC read path (read_path.h): the Fetch stream, which every server has and which
// serves what the other paths cannot (device pools, a broken channel, a restarted server).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/src/client_impl.h"
#include "client/src/convert.h"
#include "client/src/read_path.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "proto/rpc_status.h"

namespace kvc::client::internal {
namespace {

namespace pb = ::kvcache::v1;

class GrpcReadPath final : public ReadPath {
 public:
  GrpcReadPath(KvCacheClient& client, const KvCacheClient::Impl& impl)
      : client_(client), impl_(impl) {}
  std::string name() const override { return "grpc"; }
  bool Alive() override { return true; }

  absl::Status ReadChunks(const std::string& sequence_id, const FetchOptions& options,
                          const ChunkFn& on_chunk, const CallOptions& call,
                          std::string* /*fall_back*/) override {
    pb::FetchRequest request;
    request.set_sequence_id(sequence_id);
    for (int layer : options.layers) request.add_layers(layer);
    request.set_format(options.stored_format ? pb::FETCH_FORMAT_STORED : pb::FETCH_FORMAT_DENSE);
    request.set_dtype(ToProto(options.dtype));
    request.set_max_chunk_bytes(options.max_chunk_bytes);
    request.set_include_unfinished(options.include_unfinished);
    // Retried only while no chunk has been delivered, so the caller never sees duplicates; a
    // stream that broke after a chunk is the caller's error, never a truncated success.
    bool delivered = false;
    return impl_.Retry(
        [&]() -> absl::Status {
          grpc::ClientContext context;
          impl_.Prepare(&context, call);
          auto reader = impl_.kv->Fetch(&context, request);
          pb::FetchChunk message;
          absl::Status callback_status;
          while (reader->Read(&message)) {
            delivered = true;
            FetchedChunk chunk = FromProto(message);
            callback_status = on_chunk(chunk);
            if (!callback_status.ok()) {
              context.TryCancel();
              break;
            }
          }
          absl::Status status = FromGrpcStatus(reader->Finish());
          if (!callback_status.ok()) return callback_status;
          if (!status.ok() && delivered) {
            // A stream that broke midway cannot be resumed transparently.
            return absl::Status(status.code(),
                                absl::StrCat("Fetch broke after some chunks: ", status.message()));
          }
          return status;
        },
        [&] { return !delivered; });
  }

  absl::Status ReadInto(const std::string& sequence_id, const std::vector<int32_t>& layers,
                        const std::vector<LayerBuffers>& buffers, const FetchIntoOptions& options,
                        const CallOptions& call, FetchIntoResult* out,
                        std::string* /*fall_back*/) override {
    // Over gRPC: the shape comes from GetSequence (a lane with no tokens sends no chunk), the
    // rows from the dense chunks, copied in as they arrive.
    absl::StatusOr<SequenceInfo> info = client_.GetSequence(sequence_id, call);
    if (!info.ok()) return info.status();
    const size_t heads = static_cast<size_t>(options.num_kv_heads);
    if (info->layer_tokens.empty() ||
        info->stored_tokens.size() != info->layer_tokens.size() * heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the buffers are for ", options.num_kv_heads, " kv heads but the sequence has ",
          info->layer_tokens.empty() ? 0 : info->stored_tokens.size() / info->layer_tokens.size()));
    }
    const size_t row =
        static_cast<size_t>(options.head_dim) * (options.dtype == DType::kF32 ? 4 : 2);
    FetchIntoResult& result = *out;
    result.lane_tokens.assign(buffers.size() * heads, 0);
    std::vector<std::vector<int32_t>> positions(options.positions ? result.lane_tokens.size() : 0);
    FetchOptions fetch;
    fetch.layers.assign(layers.begin(), layers.end());
    fetch.dtype = options.dtype;
    fetch.include_unfinished = options.include_unfinished;
    std::string unused;
    absl::Status status = ReadChunks(
        sequence_id, fetch,
        [&](FetchedChunk& chunk) -> absl::Status {
          const size_t b = static_cast<size_t>(
              std::find(layers.begin(), layers.end(), chunk.layer) - layers.begin());
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
                n == 0 ? 0
                       : chunk.keys.size() / n / (row / static_cast<size_t>(options.head_dim))));
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
          const size_t at = (static_cast<size_t>(chunk.kv_head) *
                                 static_cast<size_t>(buffers[b].capacity_tokens) +
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
        call, &unused);
    if (!status.ok()) return status;
    if (result.visible_tokens == 0) result.visible_tokens = info->visible_tokens;
    for (const std::vector<int32_t>& p : positions) {
      result.positions.insert(result.positions.end(), p.begin(), p.end());
    }
    return absl::OkStatus();
  }

 private:
  KvCacheClient& client_;
  const KvCacheClient::Impl& impl_;
};

}  // namespace

std::shared_ptr<ReadPath> MakeGrpcReadPath(KvCacheClient& client, const KvCacheClient::Impl& impl) {
  return std::make_shared<GrpcReadPath>(client, impl);
}

}  // namespace kvc::client::internal
