#include "client/src/append_streams.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/src/convert.h"
#include "proto/rpc_status.h"

namespace kvc::client::internal {

namespace pb = ::kvcache::v1;

int64_t RoundUp64(int64_t n) { return (n + 63) / 64 * 64; }

bool ServerMayStillRead(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
      return true;
    default:
      return false;
  }
}

std::optional<StagingSpace::Slot> Stage(StagingSpace& staging, const AppendChunk& chunk,
                                        pb::AppendRequest* request) {
  if (chunk.bytes == 0 || chunk.keys == nullptr || chunk.values == nullptr) return std::nullopt;
  const int64_t half = RoundUp64(static_cast<int64_t>(chunk.bytes));
  std::optional<StagingSpace::Slot> slot = staging.Acquire(2 * half);
  if (!slot.has_value()) return slot;
  AppendChunk header = chunk;
  header.keys = header.values = nullptr;
  header.bytes = 0;
  ToProto(header, request);
  std::memcpy(slot->data(), chunk.keys, chunk.bytes);
  std::memcpy(slot->data() + half, chunk.values, chunk.bytes);
  pb::StagedKv* staged = request->mutable_staged();
  staged->set_region_id(staging.id());
  staged->set_keys_offset(slot->offset());
  staged->set_values_offset(slot->offset() + half);
  staged->set_bytes(static_cast<int64_t>(chunk.bytes));
  return slot;
}

namespace {

class GrpcAppendStream final : public AppendStream {
 public:
  GrpcAppendStream(pb::KvCacheService::Stub* stub, const KvCacheClient::Impl& impl,
                   const CallOptions& call) {
    impl.Prepare(&context_, call);
    writer_ = stub->AppendStream(&context_, &response_);
  }

  absl::Status Write(const AppendChunk& chunk) override {
    if (broken_) return absl::FailedPreconditionError("the append stream is broken; call Finish()");
    request_.Clear();
    ToProto(chunk, &request_);
    if (!writer_->Write(request_)) {
      broken_ = true;
      return absl::AbortedError("the server closed the append stream; call Finish() for why");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<AppendStreamResult> Finish() override {
    if (finished_) return absl::FailedPreconditionError("Finish() was already called");
    finished_ = true;
    writer_->WritesDone();
    const absl::Status status = FromGrpcStatus(writer_->Finish());
    if (!status.ok()) return status;
    return AppendStreamResult{response_.messages(), response_.tokens(), response_.visible_tokens()};
  }

 private:
  grpc::ClientContext context_;
  pb::AppendStreamResponse response_;
  pb::AppendRequest request_;
  std::unique_ptr<grpc::ClientWriter<pb::AppendRequest>> writer_;
  bool broken_ = false;
  bool finished_ = false;
};

// An AppendStream on the same node: each chunk is one Append whose keys and values go through
// the staging region (only offsets go over gRPC), under the stream's deadline. Up to
// kMaxInFlight of them are in flight at once, so copying the next chunk overlaps the server
// writing the last; chunks of one (sequence, layer) stay in order (one in flight at a time),
// which is the only order the service requires. A chunk that does not fit the free part of
// the region waits for the others to finish; one larger than the region goes as bytes.
// A rejected chunk breaks the stream: Finish() names it and says how many chunks were applied
// (chunks of other layers already in flight may have been).
class StagedAppendStream final : public AppendStream {
 public:
  static constexpr size_t kMaxInFlight = 4;

  StagedAppendStream(const KvCacheClient::Impl& impl, std::shared_ptr<StagingSpace> staging,
                     absl::Duration deadline)
      : impl_(impl), staging_(std::move(staging)), end_(absl::Now() + deadline) {}
  StagedAppendStream(const StagedAppendStream&) = delete;
  StagedAppendStream& operator=(const StagedAppendStream&) = delete;
  ~StagedAppendStream() override {  // the callbacks reference this stream
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return Idle(); });
  }

  absl::Status Write(const AppendChunk& chunk) override {
    if (finished_) return absl::FailedPreconditionError("Finish() was already called");
    auto call = std::make_unique<Call>();
    call->index = written_++;
    call->key = {chunk.sequence_id, chunk.layer};
    call->start_position = chunk.start_position;
    call->num_tokens = chunk.num_tokens;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return MayStart(call->key); });
      if (!error_.ok()) return absl::AbortedError("the append stream broke; call Finish() for why");
    }
    const absl::Duration left = end_ - absl::Now();
    if (left <= absl::ZeroDuration()) {
      std::lock_guard<std::mutex> lock(mu_);
      Fail(*call, absl::DeadlineExceededError("the append stream's deadline passed"));
      return absl::AbortedError("the append stream broke; call Finish() for why");
    }
    call->slot = Stage(*staging_, chunk, &call->request);
    if (!call->slot.has_value() && chunk.bytes > 0 &&
        2 * RoundUp64(static_cast<int64_t>(chunk.bytes)) <= staging_->bytes()) {
      std::unique_lock<std::mutex> lock(mu_);  // the region is busy: wait until it is empty
      changed_.wait(lock, [this] { return Idle(); });
      lock.unlock();
      call->slot = Stage(*staging_, chunk, &call->request);
    }
    if (!call->slot.has_value()) ToProto(chunk, &call->request);  // larger than the region
    impl_.Prepare(&call->context, CallOptions{left});
    Call* raw = call.get();
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.emplace(raw, std::move(call));
    }
    impl_.kv->async()->Append(&raw->context, &raw->request, &raw->response,
                              [this, raw](const grpc::Status& status) { Done(raw, status); });
    return absl::OkStatus();
  }

  absl::StatusOr<AppendStreamResult> Finish() override {
    if (finished_) return absl::FailedPreconditionError("Finish() was already called");
    finished_ = true;
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return Idle(); });
    if (!error_.ok()) {
      return absl::Status(error_.code(), absl::StrCat(error_.message(), "; ", result_.messages,
                                                      " messages were applied"));
    }
    return result_;
  }

 private:
  struct Call {
    int64_t index = 0;
    std::pair<std::string, int> key;  // (sequence, layer)
    int64_t start_position = 0;
    int num_tokens = 0;
    grpc::ClientContext context;
    pb::AppendRequest request;
    pb::AppendResponse response;
    std::optional<StagingSpace::Slot> slot;
  };

  // The members below `mu_` are guarded by it (a std::mutex, whose edges ThreadSanitizer sees
  // through gRPC's callback threads; the analysis cannot check it).
  bool Idle() const { return in_flight_.empty(); }
  bool MayStart(const std::pair<std::string, int>& key) const {
    if (!error_.ok()) return true;
    if (in_flight_.size() >= kMaxInFlight) return false;
    for (const auto& [raw, call] : in_flight_) {
      if (call->key == key) return false;
    }
    return true;
  }
  // Keeps the first rejected message's error (by message order).
  void Fail(const Call& call, const absl::Status& status) {
    if (!error_.ok() && failed_index_ < call.index) return;
    failed_index_ = call.index;
    error_ = absl::Status(
        status.code(),
        absl::StrCat("AppendStream message ", call.index, " (layer ", call.key.second,
                     ", start_position ", call.start_position, ") rejected: ", status.message()));
  }
  void Done(Call* call, const grpc::Status& grpc_status) {
    const absl::Status status = FromGrpcStatus(grpc_status);
    // The server may still be reading a slot whose call ended without its answer.
    if (call->slot.has_value() && ServerMayStillRead(status)) call->slot->Abandon();
    std::lock_guard<std::mutex> lock(mu_);
    if (status.ok()) {
      ++result_.messages;
      result_.tokens += call->num_tokens;
      result_.visible_tokens = std::max(result_.visible_tokens, call->response.visible_tokens());
    } else {
      Fail(*call, status);
    }
    in_flight_.erase(call);  // frees the slot
    changed_.notify_all();
  }

  const KvCacheClient::Impl& impl_;
  // Shared with the client: the region stays mapped while this stream uses it, even if the
  // client drops it meanwhile (the server restarted).
  const std::shared_ptr<StagingSpace> staging_;
  const absl::Time end_;
  int64_t written_ = 0;    // the writer's thread only
  bool finished_ = false;  // the writer's thread only
  std::mutex mu_;
  std::condition_variable changed_;  // a call ended
  std::map<Call*, std::unique_ptr<Call>> in_flight_;
  AppendStreamResult result_;
  absl::Status error_;
  int64_t failed_index_ = 0;
};

}  // namespace

std::unique_ptr<AppendStream> MakeGrpcAppendStream(const KvCacheClient::Impl& impl,
                                                   const CallOptions& call) {
  return std::make_unique<GrpcAppendStream>(impl.kv.get(), impl, call);
}

std::unique_ptr<AppendStream> MakeStagedAppendStream(const KvCacheClient::Impl& impl,
                                                     std::shared_ptr<StagingSpace> staging,
                                                     absl::Duration deadline) {
  return std::make_unique<StagedAppendStream>(impl, std::move(staging), deadline);
}

}  // namespace kvc::client::internal
