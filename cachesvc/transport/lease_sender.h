// SendLeasedBlocks: the sending half of every transfer channel (TCP: tcp_channels.h, NCCL:
// nccl_channels.h): a live lease's blocks copied out of the pool into a BlockSink, in the
// payload's order and pieces (transfer/payload.h), each piece copied (the lease checked
// live after it) before it is written. The payload layout is the transfer library's; which
// blocks a lease pins, the store's (LeaseService::PinnedLease).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/pool/block_pool.h"
#include "cachesvc/core/store/lease_service.h"

namespace kvc::cachesvc {

// Where a lease's blocks go: Begin once, before any byte, with the payload's size; then
// Write in order, a piece at a time.
class BlockSink {
 public:
  virtual ~BlockSink() = default;
  virtual absl::Status Begin(int64_t blocks, int64_t bytes) = 0;
  virtual absl::Status Write(const char* data, size_t bytes) = 0;
  // Where Write's bytes lie: host memory (null: a TCP channel), or the memory of the pool
  // returned (a sender from the device, such as an NCCL channel, whose communicator lives on
  // that pool's device). Only that pool's leases are sent to such a sink, and only if it is
  // a device pool (FAILED_PRECONDITION before Begin otherwise), with the calling thread
  // bound to the pool's device (KernelBackend::BindThread) before Begin.
  virtual const BlockPool* SendsFromPool() const { return nullptr; }
  // Called before a SendsFromPool sender takes the piece buffer it copies each piece into
  // (device memory outside the pool's capacity): `bytes` held until the send ends. An error
  // refuses the send before Begin (RESOURCE_EXHAUSTED naming a budget).
  virtual absl::Status Reserve(int64_t bytes) { return absl::OkStatus(); }
};

struct SentBlocks {
  int64_t blocks = 0;
  int64_t bytes = 0;
};

// Copies the blocks of `scope`'s live lease into `sink` as the payload layout orders them,
// each block with the slots the lease does not describe zeroed (they may be written
// meanwhile or hold another sequence's data). NOT_FOUND, before Begin, for a lease that is
// not live; ABORTED, after Begin, when the lease ended during the copy (blocks may have been
// recycled: nothing sent counts); FAILED_PRECONDITION, before Begin, for a sink that sends
// from a pool's memory and a lease of another pool or of a host pool; the sink's errors as
// they come.
absl::StatusOr<SentBlocks> SendLeasedBlocks(const LeaseService& leases, const TenantScope& scope,
                                            const std::string& lease_id, BlockSink* sink);

}  // namespace kvc::cachesvc
