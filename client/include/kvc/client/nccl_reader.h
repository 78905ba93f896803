// NcclReader: reads a DEVICE pool of a kvcached on another GPU (another node, or one that
// cannot share its memory with this process) into an engine's GPU buffers over an NCCL
// transfer (issue #13 item 4; docs/ARCHITECTURE.md "Transfers"). It opens the transfer
// (KvCacheClient::OpenNcclTransfer), joins its two-rank communicator as rank 1 on this
// process's device, and then, per FetchInto: leases the layers, asks the server to send the
// lease (SendLease) while it receives the frame header and the blocks' pieces with ncclRecv
// into device memory, ends the lease (the blocks are this process's copy now), and decodes
// them with the kernels' ReadTokens into the buffers, as DeviceReader does from the pool.
//
// NCCL is loaded at run time (common/nccl_api.h) from Options::library. Needs the CUDA
// backend (kvc::kernels built with CUDA, or the cudasim test build). A transfer that failed
// mid-frame cannot be resynchronized: every later FetchInto is UNAVAILABLE; make another
// reader. One FetchInto at a time (NCCL orders a communicator's operations); thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvc/client/kv_cache_client.h"
#include "kvc/client/types.h"

namespace kvc::client {

class NcclReader {
 public:
  struct Options {
    std::string pool;                      // the device pool to read ("" = the default one)
    std::string library = "libnccl.so.2";  // NCCL >= 2.14
    int device = 0;                        // this process's CUDA device (rank 1's)
  };
  // Opens the transfer and joins it (within the server's connect_within).
  // FAILED_PRECONDITION when NCCL cannot be loaded, the server offers no NCCL transfers or
  // the pool is a host pool; UNAVAILABLE when this build has no CUDA backend or the join
  // fails. `client` must outlive the reader.
  static absl::StatusOr<std::unique_ptr<NcclReader>> Open(KvCacheClient* client,
                                                          const Options& options,
                                                          const CallOptions& call = {});
  NcclReader(const NcclReader&) = delete;
  NcclReader& operator=(const NcclReader&) = delete;
  ~NcclReader();  // closes the transfer and leaves the communicator

  // As DeviceReader::FetchInto, from the transfer's pool: device buffers on Options::device.
  // The sequence must be in that pool (FAILED_PRECONDITION otherwise, before anything is
  // sent); INVALID_ARGUMENT / OUT_OF_RANGE as FetchInto (before anything is written);
  // UNAVAILABLE once the transfer broke.
  absl::StatusOr<FetchIntoResult> FetchInto(const std::string& sequence_id,
                                            const std::vector<LayerBuffers>& buffers,
                                            const FetchIntoOptions& options,
                                            const CallOptions& call = {});

  // "NCCL 2.28.9 (libnccl.so.2), transfer n-..." for logs.
  std::string Describe() const;

  struct Impl;

 private:
  explicit NcclReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvc::client
