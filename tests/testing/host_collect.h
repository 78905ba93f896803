// A BlockSink that keeps what SendLeasedBlocks writes in host memory: what a TCP
// transfer carries for a lease, to compare other sinks' bytes with.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "cachesvc/core/store/kv_store.h"
#include "cachesvc/transport/lease_sender.h"

namespace kvc::testing {

class HostCollect final : public cachesvc::BlockSink {
 public:
  std::string bytes;
  absl::Status Begin(int64_t /*blocks*/, int64_t /*bytes*/) override { return absl::OkStatus(); }
  absl::Status Write(const char* data, size_t n) override {
    bytes.append(data, n);
    return absl::OkStatus();
  }
};

}  // namespace kvc::testing
