// TransferReader: the client's half of a transfer channel (KvCacheService.OpenTransfer /
// SendLease; cachesvc/transport/tcp_channels.h). It connects to the server's transfer
// listener over TCP, greets with the channel's id and token, and then receives leased blocks:
// Fetch runs the SendLease call on a helper thread while it reads the frame that call writes,
// and hands back the blocks with the lease renumbered to them, ready for lease_decode.h (the
// decode the shared-memory path uses too). Any failure of the byte stream closes the channel
// for good (Alive() turns false): the client then opens another or reads over gRPC.
// Thread-safe; one Fetch at a time per channel (later ones wait).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/src/lease_decode.h"
#include "client/src/lease_payload.h"
#include "common/mutex.h"
#include "kvc/client/types.h"
#include "transfer/stream.h"

namespace kvc::client::internal {

// A lease's blocks as received. `lease` is the original with every segment's blocks
// renumbered to their place among its format's blocks in the payload, so arenas() serves
// them as the pool's arenas would.
struct ReceivedBlocks {
  Lease lease;
  transfer::PayloadLayout layout;  // where each format's blocks lie in payload
  std::unique_ptr<uint8_t[]> payload;
  int64_t bytes = 0;
  int64_t capacity = 0;  // of payload (a reused buffer may be larger than bytes)
  ArenaLookup arenas() const;
};

// The lease renumbered as SendLease orders its blocks (lease_payload.h), with no payload yet.
// INTERNAL when a segment's format has no arena in the lease.
absl::StatusOr<ReceivedBlocks> PlanReceive(const Lease& lease);

// How to reach a channel OpenTransfer answered.
struct TransferEndpoint {
  std::string host;
  int port = 0;
  std::string transfer_id;
  std::string token;
  std::string frame_key;  // keys every frame's MAC (transfer/frame_mac.h)
  // Set: the listener speaks TLS; its certificate must chain to this context's CAs and name
  // `server_name`.
  std::shared_ptr<transfer::TlsContext> tls;
  std::string server_name;
};

class TransferReader {
 public:
  // UNAVAILABLE when nothing accepts at host:port or the TLS handshake fails;
  // FAILED_PRECONDITION when the server refuses the greeting (its reason).
  static absl::StatusOr<std::unique_ptr<TransferReader>> Connect(const TransferEndpoint& at);
  TransferReader(const TransferReader&) = delete;
  TransferReader& operator=(const TransferReader&) = delete;
  ~TransferReader();

  const std::string& id() const { return id_; }
  const std::string& where() const { return where_; }
  // False once the byte stream failed or the server hung up. Never blocks.
  bool Alive();

  // The blocks of `lease`: runs send(nonce) (the SendLease call) on a helper thread and reads
  // its frame until `deadline`. The call's error when it fails; UNAVAILABLE /
  // DEADLINE_EXCEEDED / INTERNAL when the stream breaks, stalls or is out of step, DATA_LOSS
  // when the frame's MAC (or a TLS record) does not match what came (the channel is then
  // closed, and nothing of the frame is returned).
  absl::StatusOr<ReceivedBlocks> Fetch(const Lease& lease,
                                       const std::function<absl::Status(uint64_t nonce)>& send,
                                       absl::Time deadline);
  // Gives a Fetch's payload back once it is decoded: the next Fetch that fits reuses it
  // instead of faulting in fresh pages (up to kMaxSpareBytes are kept).
  void Recycle(ReceivedBlocks blocks);
  static constexpr int64_t kMaxSpareBytes = int64_t{1} << 30;

 private:
  TransferReader(std::unique_ptr<transfer::Stream> stream, std::string id, std::string where,
                 std::string frame_key, uint64_t first_nonce)
      : stream_(std::move(stream)),
        id_(std::move(id)),
        where_(std::move(where)),
        frame_key_(std::move(frame_key)),
        nonce_(first_nonce) {}
  void Break() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  kvc::Mutex mu_;
  const std::unique_ptr<transfer::Stream> stream_;  // reads under mu_; Shutdown from anywhere
  const std::string id_;
  const std::string where_;
  const std::string frame_key_;
  uint64_t frames_ ABSL_GUARDED_BY(mu_) = 0;  // read so far: the next frame's MAC nonce
  uint64_t nonce_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<uint8_t[]> spare_ ABSL_GUARDED_BY(mu_);  // a recycled payload buffer
  int64_t spare_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> broken_{false};
};

}  // namespace kvc::client::internal
