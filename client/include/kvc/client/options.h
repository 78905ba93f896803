// The options of a KvCacheClient (ClientOptions: where and how to connect, which data paths
// it may use) and of each call (CallOptions).
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace kvc::client {

// TLS to kvcached; plaintext while ca_file is empty. The files are read once, by Connect.
struct ClientTlsOptions {
  std::string ca_file;    // PEM CAs that kvcached's certificate must chain to; set = TLS
  std::string cert_file;  // PEM certificate chain of this client, for mTLS (with key_file)
  std::string key_file;   // its unencrypted PEM private key
  // The name kvcached's certificate must carry when it is not the target's host (a target
  // reached through a tunnel, an IP with a DNS-only certificate). Empty = the target's host.
  std::string server_name;
};

struct ClientOptions {
  std::string target = "127.0.0.1:50051";  // any gRPC target: host:port, unix:/path, dns:///
  ClientTlsOptions tls;
  // Sent as "authorization: Bearer <token>" on every call when set. Printable ASCII.
  std::string bearer_token;
  absl::Duration default_deadline = absl::Seconds(30);
  int max_attempts = 4;  // for retried calls; 1 disables retries
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  int64_t max_message_bytes = int64_t{16} << 20;
  // Longest wait between attempts to re-dial a lost server; zero = gRPC's default (up to
  // 120 s). The cluster client sets 1 s so a restarted shard rejoins quickly.
  absl::Duration max_reconnect_backoff = absl::ZeroDuration();
  // Fetch reads host pools straight from the server's memory when the server is on this node
  // and lets this process map its pools (ServerInfo.local_socket; docs/ARCHITECTURE.md
  // "Same-node reads"): a lease, then the records from the mapping. Otherwise, or when off,
  // every byte comes over gRPC. DataPath() says which is used and why.
  bool local_reads = true;
  // With local_reads and a server on this node, Append and AppendStream copy keys and values
  // into a staging region of this many bytes that the server reads them from (the request
  // carries offsets, not bytes); a chunk that does not fit the free part of the region goes
  // over gRPC. 0: every Append carries its bytes over gRPC. AppendPath() says which.
  int64_t staging_bytes = int64_t{64} << 20;
  // Without the same-node path, Fetch and FetchInto receive a lease's blocks over a transfer
  // channel when the server offers one (ServerInfo.transfer_port; docs/ARCHITECTURE.md
  // "Transfers"): raw blocks over TCP, decoded here, instead of per-token protobuf. Under a
  // server with TLS the channel runs TLS too (verified as gRPC is, with tls.ca_file); every
  // frame carries a MAC, so a changed one is refused and that fetch reads over gRPC. Without
  // TLS the KV crosses the network in the clear: leave this off there on untrusted networks.
  // A channel that fails is dropped and that call reads over gRPC.
  bool transfers = true;
};

struct CallOptions {
  absl::Duration deadline = absl::ZeroDuration();  // zero = ClientOptions::default_deadline
};

}  // namespace kvc::client
