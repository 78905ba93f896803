// TransferChannels: one kind of transfer channel (TCP: tcp_channels.h; NCCL:
// nccl_channels.h) as KvCacheService's OpenTransfer / SendLease / CloseTransfer reach it.
// Transfers (transfers.h) holds the kinds a server offers and picks one per call, so the
// service has one call per RPC and no branch per kind; adding a kind is its own file and
// one Offer in the server.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/transport/lease_sender.h"

namespace kvc::cachesvc {

// What OpenTransfer answers (kvcache.v1.OpenTransferResponse); each kind fills its part.
struct OpenedTransfer {
  std::string id;
  int64_t connect_within_ms = 0;
  // TCP: where to connect ("" host: the one gRPC was reached at), the token to greet with,
  // the key of its frames' MACs and whether the listener speaks TLS.
  std::string host;
  int port = 0;
  std::string token;
  std::string frame_key;
  bool tls = false;
  // NCCL: the communicator's unique id and the server's NCCL version.
  std::string nccl_unique_id;
  int nccl_version = 0;
};

class TransferChannels {
 public:
  virtual ~TransferChannels() = default;
  // A channel of `scope`'s (for NCCL, carrying pool `pool`'s leases; TCP ignores it).
  virtual absl::StatusOr<OpenedTransfer> Open(const TenantScope& scope,
                                              const std::string& pool) = 0;
  // SendLease (see the proto). `deadline`: the call's.
  virtual absl::StatusOr<SentBlocks> Send(const TenantScope& scope, const std::string& id,
                                          const std::string& lease_id, uint64_t nonce,
                                          absl::Time deadline) = 0;
  virtual absl::Status Close(const TenantScope& scope, const std::string& id) = 0;
};

}  // namespace kvc::cachesvc
