// TcpChannels: the byte channels of KvCacheService.OpenTransfer / SendLease (issue #13
// item 4; docs/ARCHITECTURE.md "Transfers"). A reader that cannot map the pools (another
// node) opens a channel over gRPC (authenticated, in its scope), connects to the TCP listener
// here and presents the channel's token; SendLease then writes a lease's blocks into the
// connection as they lie in the pool (a frame header, then the raw blocks: no protobuf, no
// per-token work on the server), and the reader decodes them with the client's codec.
//
// Failure: a reader that stops reading stalls a send for at most `write_stall`, then the
// channel closes (DEADLINE_EXCEEDED); one that goes away breaks it (UNAVAILABLE); a lease
// that ends while its blocks are read aborts the send (ABORTED). A failure after a payload
// began closes the channel (the byte stream cannot be resynchronized): the reader opens
// another. Channels are per scope (another tenant's id is NOT_FOUND), at most
// kMaxPerScope each; an unconnected one is dropped after `connect_within`. Connections that
// have not greeted are bounded per peer and in all and dropped after `greeting_within`.
// Thread-safe: sends on different channels run in parallel, on one channel in call order.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/store/lease_service.h"
#include "cachesvc/transport/lease_sender.h"
#include "cachesvc/transport/scoped_channels.h"
#include "cachesvc/transport/transfer_channels.h"
#include "common/mutex.h"
#include "transfer/stream.h"

namespace kvc::cachesvc {

struct TcpChannelOptions {
  std::string listen;          // "host:port" (port 0: any free one)
  std::string advertise_host;  // what OpenTransfer tells readers ("" = the gRPC host)
  absl::Duration connect_within = absl::Seconds(10);
  absl::Duration write_stall = absl::Seconds(30);
  // Connections that have not greeted yet cost the listener a slot each, so they are bounded:
  // a reader greets as soon as it is connected (one line), so an idle one is dropped after
  // greeting_within (2 s: many round trips of a congested WAN); at most
  // max_ungreeted_per_peer from one remote address (an IPv6 /64), so one peer cannot take
  // every slot; at most max_ungreeted in all, and when all are taken the oldest is dropped
  // to make room, so peers with many addresses delay a greeting by at most greeting_within
  // instead of refusing it.
  absl::Duration greeting_within = absl::Seconds(2);
  int max_ungreeted_per_peer = 8;
  int max_ungreeted = 64;
  // TLS on the listener (the gRPC listener's PEM files; empty = in the clear). A changed
  // file is picked up by the next connection.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Called for "opened", "connected", "refused", "sent", "failed", "closed" (metrics).
  std::function<void(const char* event)> on_event;
};

class TcpChannels final : public TransferChannels {
 public:
  static constexpr int kMaxPerScope = ScopedChannels<int>::kMaxPerScope;

  // Binds the listener. UNAVAILABLE when it cannot; INVALID_ARGUMENT for a malformed address.
  static absl::StatusOr<std::unique_ptr<TcpChannels>> Start(const TcpChannelOptions& options,
                                                            LeaseService* leases);
  TcpChannels(const TcpChannels&) = delete;
  TcpChannels& operator=(const TcpChannels&) = delete;
  // Stops listening and closes every channel; no send may be running.
  ~TcpChannels() override;

  int port() const { return port_; }

  // The prefix of the ids it makes (NCCL channels': "n-").
  static constexpr char kIdPrefix[] = "t-";
  // RESOURCE_EXHAUSTED when the scope has kMaxPerScope channels open. Any pool's leases.
  absl::StatusOr<OpenedTransfer> Open(const TenantScope& scope, const std::string& pool) override;
  absl::StatusOr<SentBlocks> Send(const TenantScope& scope, const std::string& id,
                                  const std::string& lease_id, uint64_t nonce,
                                  absl::Time deadline) override;
  absl::Status Close(const TenantScope& scope, const std::string& id) override;

 private:
  struct Channel {
    TenantScope scope;
    std::string token;
    absl::Time opened;
    kvc::Mutex send_mu;     // one send at a time, in call order
    std::string frame_key;  // transfer::kFrameKeyBytes; keys every frame's MAC
    uint64_t frames ABSL_GUARDED_BY(send_mu) = 0;  // written so far: the next frame's number
    std::unique_ptr<transfer::Stream> stream ABSL_GUARDED_BY(send_mu);  // null until greeted
    bool broken ABSL_GUARDED_BY(send_mu) = false;
    Channel() = default;
    Channel(const Channel&) = delete;
    Channel& operator=(const Channel&) = delete;
    ~Channel();  // closes the connection
  };
  struct Pending {  // an accepted connection whose greeting is not complete yet
    std::unique_ptr<transfer::Stream> stream;
    transfer::Stream::Want want = transfer::Stream::Want::kRead;  // what to poll for
    absl::Time accepted;
    std::string peer;  // its remote address (IPv6: the /64), what the per-peer limit counts
    std::string line;
  };
  TcpChannels(const TcpChannelOptions& options, LeaseService* leases)
      : options_(options), leases_(leases) {}
  void Serve();
  // Reads what arrived; true when the connection is done with (attached or refused).
  bool Greet(Pending& p);
  // Accepts what the listener has, within the limits on ungreeted connections.
  void Admit(std::vector<Pending>& pending, absl::Time now);
  // Whether a channel is finished with: unconnected past connect_within, broken, or its
  // reader hung up (counted closed). Never waits for a send.
  bool Done(Channel& c, absl::Time now);
  void Event(const char* event) const {
    if (options_.on_event) options_.on_event(event);
  }
  // The TLS context for a new connection (null: in the clear), reloaded from the files when
  // they changed since the last one (a failed reload keeps the previous context and logs).
  std::shared_ptr<transfer::TlsContext> TlsForNewConnection();

  const TcpChannelOptions options_;
  LeaseService* const leases_;
  std::shared_ptr<transfer::TlsContext> tls_;  // the listener thread's only
  std::string tls_stamp_;                      // of the files tls_ was made from
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  ScopedChannels<Channel> channels_{kIdPrefix};
  std::thread thread_;
};

}  // namespace kvc::cachesvc
