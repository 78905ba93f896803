// KvCacheClient::FetchInto: a sequence's dense K/V written straight into an engine's own
// buffers, through the read path the client decided on (read_path.h, data_paths.cc).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/src/client_impl.h"
#include "client/src/read_path.h"
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
  const std::shared_ptr<internal::ReadPath> reads = internal::ReadPathFor(*this, *impl_, call);
  FetchIntoResult result;
  std::string fall_back;
  absl::Status status =
      reads->ReadInto(sequence_id, layers, buffers, options, call, &result, &fall_back);
  if (fall_back.empty()) {
    if (!status.ok()) return status;
    result.path = reads == impl_->grpc_reads ? DataPath() : reads->name();
    return result;
  }
  result = FetchIntoResult();
  result.path = std::move(fall_back);
  status =
      impl_->grpc_reads->ReadInto(sequence_id, layers, buffers, options, call, &result, &fall_back);
  if (!status.ok()) return status;
  return result;
}

}  // namespace kvc::client
