// NcclLink: an engine's NCCL link to a DEVICE pool of a kvcached on another GPU (another
// node, or one that cannot share its memory with this process): reads the pool into the
// engine's GPU buffers and appends from them, never through host memory (issue #13 item 4;
// docs/ARCHITECTURE.md "Transfers"). It opens the transfer (OpenTransfer of kind NCCL)
// and joins its two-rank communicator as rank 1 on this process's device. FetchInto leases
// the layers, asks the server to send the lease (SendLease) while it receives the frame
// header and the blocks' pieces with ncclRecv into device memory, ends the lease (the blocks
// are this process's copy now), and decodes them with the kernels' ReadTokens into the
// buffers, as DeviceReader does from the pool. Append sends a frame header, the keys and the
// values with ncclSend beside an Append call that the server answers after receiving them
// into the pool's device memory and appending them there.
//
// NCCL is loaded at run time (transfer/nccl_api.h) from Options::library. Needs the CUDA
// backend (kvc::kernels built with CUDA, or the cudasim test build). A transfer that failed
// mid-frame cannot be resynchronized: every later call is UNAVAILABLE; make another link.
// One call at a time (NCCL orders a communicator's operations); thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvc/client/kv_cache_client.h"
#include "kvc/client/types.h"

namespace kvc::client {

class NcclLink {
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
  static absl::StatusOr<std::unique_ptr<NcclLink>> Open(KvCacheClient* client,
                                                        const Options& options,
                                                        const CallOptions& call = {});
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;
  ~NcclLink();  // closes the transfer and leaves the communicator

  // As DeviceReader::FetchInto, from the transfer's pool: device buffers on Options::device.
  // The sequence must be in that pool (FAILED_PRECONDITION otherwise, before anything is
  // sent); INVALID_ARGUMENT / OUT_OF_RANGE as FetchInto (before anything is written);
  // UNAVAILABLE once the transfer broke.
  absl::StatusOr<FetchIntoResult> FetchInto(const std::string& sequence_id,
                                            const std::vector<LayerBuffers>& buffers,
                                            const FetchIntoOptions& options,
                                            const CallOptions& call = {});

  // As KvCacheClient::Append, from device memory: chunk.keys and chunk.values are buffers of
  // chunk.bytes each on Options::device (written: the engine's stream synchronized), sent
  // over the transfer, not copied to the host. chunk.bytes must be 1 .. 256 MiB
  // (INVALID_ARGUMENT before anything is sent). The sequence's pool must be on the transfer
  // pool's device: FAILED_PRECONDITION otherwise. Refusals of the append itself (as Append's:
  // out of order, bad layer, wrong size) come after the bytes arrived and leave the link
  // usable; a failure while sending breaks it (UNAVAILABLE afterwards).
  absl::StatusOr<AppendResult> Append(const AppendChunk& chunk, const CallOptions& call = {});

  // "NCCL 2.28.9 (libnccl.so.2), transfer n-..." for logs.
  std::string Describe() const;

  struct Impl;

 private:
  explicit NcclLink(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvc::client
