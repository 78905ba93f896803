// DeviceReader: same-node reads of a DEVICE pool straight into an engine's GPU buffers (issue
// #13 item 3). The server shares each device pool's memory as one CUDA IPC handle over its
// local socket (the client library's internal ShareDeviceArena, client/src/transfer_rpcs.h); this
// reader opens it once per pool, and a lease (KvCacheClient::LeaseSequence) then says where every
// lane's records are. Two ways to use it:
//   - FetchInto: leases the layers, gathers and decodes every lane's records on the device
//     (the kernels' ReadTokens, the same code the service decodes with) into the caller's
//     device buffers, waits for it, checks the lease was live throughout, releases it.
//   - PoolBase + a Lease: the device-side view for an engine's own kernels: where the pool's
//     memory starts in this process; block b of format f is at base + b * the lease's
//     arena(f)->block_bytes, its key record i at + key_offset + i * record_bytes. The lease
//     must stay live (RenewLease) while such reads run, and they must not write.
// Ordering: the server finishes (synchronizes) every write before the commit that a lease
// describes, so a lease's records are complete when the lease is granted; no CUDA event is
// needed today (the contract will carry one if commits ever go asynchronous).
// Needs the CUDA backend (kvc::kernels built with CUDA, or the cudasim test build) and the
// server on this node; the buffers must be device memory on the pool's device. The exporting
// process cannot open its own handle (CUDA refuses), so kvcached and the reader are separate
// processes. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvc/client/kv_cache_client.h"
#include "kvc/client/types.h"

namespace kvc::client {

class DeviceReader {
 public:
  // `client` must outlive the reader. UNAVAILABLE when this build has no CUDA backend.
  static absl::StatusOr<std::unique_ptr<DeviceReader>> Create(KvCacheClient* client);
  DeviceReader(const DeviceReader&) = delete;
  DeviceReader& operator=(const DeviceReader&) = delete;
  ~DeviceReader();  // closes every opened pool

  // As KvCacheClient::FetchInto, into device buffers on the sequence's pool's device.
  // FAILED_PRECONDITION for a sequence in a host pool (KvCacheClient::FetchInto reads those)
  // or without a same-node path; INVALID_ARGUMENT / OUT_OF_RANGE as FetchInto (checked before
  // anything is written); ABORTED when the lease expired before the reads finished (nothing
  // read may be used then) or is of another server than the local socket's (the server
  // restarted between the two): fetch again.
  absl::StatusOr<FetchIntoResult> FetchInto(const std::string& sequence_id,
                                            const std::vector<LayerBuffers>& buffers,
                                            const FetchIntoOptions& options,
                                            const CallOptions& call = {});

  // Where `lease`'s pool's memory starts in this process (opened on first use).
  absl::StatusOr<const void*> PoolBase(const Lease& lease, const CallOptions& call = {});

  struct Impl;

 private:
  explicit DeviceReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvc::client
