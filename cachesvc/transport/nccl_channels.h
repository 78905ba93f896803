// NcclChannels: transfer channels over NCCL (KvCacheService.OpenTransfer with kind NCCL;
// issue #13 item 4; docs/ARCHITECTURE.md "Transfers"). A reader on another GPU opens one
// for a device pool and gets an NCCL unique id; both sides join a two-rank communicator
// (kvcached rank 0 on the pool's device, the reader rank 1 on its own); SendLease then sends
// the same 32-byte frame header as the TCP wire and, after it, the lease's blocks device to
// device, in the pieces transfer/payload.h documents (each an ncclSend the reader
// matches with an ncclRecv of the same size). An Append the other way (AppendRequest.nccl):
// the peer sends a frame header, the keys and the values, which Receive takes into device
// memory of the pool and hands to the append. NCCL is loaded at run time
// (transfer/nccl_api.h) from ServerConfig.transfer_nccl_library.
//
// Failure: a join not complete within `connect_within` is aborted and the channel dropped
// (on the scope's next Open or Send); a send the reader does not receive within
// `write_stall` is aborted by the watchdog (DEADLINE_EXCEEDED); a lease that ends while its
// blocks are copied ABORTED. A refusal before the payload sends a header with the code (the
// channel stays in step); a failure after it breaks the channel for good (UNAVAILABLE
// afterwards). Channels are per scope, at most kMaxPerScope each. Thread-safe: sends and
// receives on one channel run one at a time, in call order.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cachesvc/core/base/backend_buffer.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/store/lease_service.h"
#include "cachesvc/transport/lease_sender.h"
#include "cachesvc/transport/scoped_channels.h"
#include "cachesvc/transport/transfer_channels.h"
#include "common/mutex.h"
#include "transfer/nccl_api.h"

namespace kvc::cachesvc {

struct NcclChannelOptions {
  std::string library;  // what nccl::Load opens ("libnccl.so.2", or a path)
  absl::Duration connect_within = absl::Seconds(10);
  absl::Duration write_stall = absl::Seconds(30);
  // The buffers Appends are received into (2 x nccl.bytes each, kept with their transfer) are
  // device memory outside every pool's capacity and tenant quota, so they have budgets of
  // their own: per tenant (scope) and in all. 1 GiB lets a tenant hold two transfers' buffers
  // of the largest Append (2 x 256 MiB); 4 GiB keeps a GPU's share for the pools.
  int64_t receive_bytes_per_tenant = int64_t{1} << 30;
  int64_t receive_bytes = int64_t{4} << 30;
  // Called for "opened", "connected", "sent", "received", "failed", "closed" (metrics).
  std::function<void(const char* event)> on_event;
};

class NcclChannels final : public TransferChannels {
 public:
  static constexpr int kMaxPerScope = ScopedChannels<int>::kMaxPerScope;

  // Loads the library: FAILED_PRECONDITION naming it and why when it cannot.
  static absl::StatusOr<std::unique_ptr<NcclChannels>> Start(const NcclChannelOptions& options,
                                                             LeaseService* leases);
  NcclChannels(const NcclChannels&) = delete;
  NcclChannels& operator=(const NcclChannels&) = delete;
  // Aborts every channel; no send may be running.
  ~NcclChannels() override;

  // "NCCL 2.28.9 (libnccl.so.2)".
  std::string Describe() const { return api_->Describe(); }

  // NOT_FOUND pool; FAILED_PRECONDITION for a host pool; RESOURCE_EXHAUSTED when the scope
  // has kMaxPerScope channels; UNAVAILABLE when NCCL refuses to start the join.
  absl::StatusOr<OpenedTransfer> Open(const TenantScope& scope, const std::string& pool) override;
  // SendLease (see the proto). `deadline`: the call's.
  absl::StatusOr<SentBlocks> Send(const TenantScope& scope, const std::string& id,
                                  const std::string& lease_id, uint64_t nonce,
                                  absl::Time deadline) override;
  // The receiving half of an Append over NCCL (AppendRequest.nccl, whose contract this
  // follows): receives the peer's frame header, then `bytes` of keys and `bytes` of values
  // into device memory of the transfer's pool, then calls `apply` with them and the pool's
  // device, on this thread, the channel still held (the buffer is the channel's), and
  // returns what `apply` returns: the channel stays usable. A failure before that (unknown
  // or broken transfer, bytes out of range, a header of another call, the peer not sending
  // within write_stall or `deadline`, a receive buffer past the budgets: RESOURCE_EXHAUSTED)
  // closes the channel. `bytes` at most transfer::kMaxNcclAppendBytes.
  using ApplyReceived =
      std::function<absl::Status(const char* keys, const char* values, const std::string& device)>;
  absl::Status Receive(const TenantScope& scope, const std::string& id, uint64_t nonce,
                       int64_t bytes, absl::Time deadline, const ApplyReceived& apply);
  absl::Status Close(const TenantScope& scope, const std::string& id) override;

  // The prefix of the ids it makes (TCP channels': "t-").
  static constexpr char kIdPrefix[] = "n-";

 private:
  struct Channel;
  class Sink;
  class Budget;
  NcclChannels(const NcclChannelOptions& options, LeaseService* leases, const nccl::Api* api);
  // Whether a channel is finished with: broken, or not joined within connect_within
  // (counted closed; its comm is aborted when it is dropped). Never waits for a send.
  bool Done(Channel& c, absl::Time now);
  // With c.op_mu held: OK when the channel can carry a call (not broken, joined: waits for
  // the join within connect_within and `deadline`); binds this thread to the pool's device.
  absl::Status Ready(Channel& c, const std::string& id, absl::Time deadline);
  // Aborts the comm of a send still running past its deadline (a reader that stopped).
  void Watch();
  void Event(const char* event) const {
    if (options_.on_event) options_.on_event(event);
  }

  const NcclChannelOptions options_;
  LeaseService* const leases_;
  const nccl::Api* const api_;
  // Shared with each channel's charge, which may be given back after this is gone.
  const std::shared_ptr<Budget> budget_;
  ScopedChannels<Channel> channels_{kIdPrefix};
  kvc::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
};

}  // namespace kvc::cachesvc
