// Endpoints: what this server tells clients about its data paths beside gRPC
// (ServerInfo.local_socket / local_token / transfer_port / nccl_transfers, and the
// local_token every Lease carries). KvCacheServer fills it as it starts those paths, before
// it serves, and owns it; the services read it (never the store: the core knows no RPC-layer
// facts).
#pragma once

#include <string>

namespace kvc::cachesvc {

struct Endpoints {
  std::string local_socket;    // the unix socket's path; "" = no same-node path
  std::string local_token;     // names this server in the socket's greeting and in leases
  int transfer_port = 0;       // the TCP transfer listener's; 0 = none
  std::string nccl_transfers;  // what serves NCCL transfers ("NCCL 2.x (lib)"); "" = none
};

}  // namespace kvc::cachesvc
