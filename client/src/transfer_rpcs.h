// The calls the transports beside the client make (kvc::client::NcclLink, DeviceReader, the
// leased read path): the same-node CUDA IPC handle of a device pool, and NCCL transfers
// (OpenTransfer of kind NCCL, SendLease, CloseTransfer, Append over a transfer). Internal to
// the client libraries: engines use Fetch, FetchInto, NcclLink and DeviceReader instead.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvc/client/kv_cache_client.h"
#include "kvc/client/types.h"

namespace kvc::client::internal {

// The CUDA IPC handle of a device pool's memory, from the server's local socket (the
// same-node path: local_reads, and a server on this node that lets this uid in).
// FAILED_PRECONDITION when the client has no same-node path (the message says why, as
// DataPath()) or `pool` is a host pool or cannot be shared; NOT_FOUND for an unknown pool.
// Whoever holds the handle can open the pool read-write: never write through it.
absl::StatusOr<DeviceArenaHandle> ShareDeviceArena(KvCacheClient& client, const std::string& pool,
                                                   StorageFormat format,
                                                   const CallOptions& call = {});

// NCCL transfers (the server's ServerInfo::nccl_transfers): opens one of device pool `pool`
// for a reader that joins it as rank 1 (NcclLink does); then SendLease sends a lease's frame
// on it and CloseTransfer ends it. FAILED_PRECONDITION when the server offers none or `pool`
// is a host pool.
absl::StatusOr<NcclTransfer> OpenNcclTransfer(KvCacheClient& client, const std::string& pool,
                                              const CallOptions& call = {});
absl::Status SendLease(KvCacheClient& client, const std::string& transfer_id,
                       const std::string& lease_id, uint64_t nonce, const CallOptions& call = {});
absl::Status CloseTransfer(KvCacheClient& client, const std::string& transfer_id,
                           const CallOptions& call = {});
// An Append whose keys and values the caller sends over NCCL transfer `transfer_id` beside
// this call, as AppendRequest.nccl says (a frame header with `nonce`, then chunk.bytes of
// keys and of values); chunk.keys and chunk.values are not read. NcclLink::Append does both.
absl::StatusOr<AppendResult> AppendOverTransfer(KvCacheClient& client, const AppendChunk& chunk,
                                                const std::string& transfer_id, uint64_t nonce,
                                                const CallOptions& call = {});

}  // namespace kvc::client::internal
