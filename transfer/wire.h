// The transfer channel's wire (kvcache.v1 KvCacheService.OpenTransfer / SendLease): the
// greeting a reader sends after it connects, the 32-byte frame header the server writes
// before each lease's blocks (on a TCP channel the frame then ends with its MAC:
// frame_mac.h), and socket reads and writes with a deadline. Shared by kvcached
// and the client library (which installs it with its package): Abseil and POSIX only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kvc::transfer {

inline constexpr size_t kHeaderBytes = 32;
inline constexpr size_t kMaxGreetingBytes = 256;
// The most keys (and as many values) one Append over NCCL carries (AppendRequest.nccl.bytes):
// the server's receive buffer is twice this at most.
inline constexpr int64_t kMaxNcclAppendBytes = int64_t{256} << 20;

struct FrameHeader {
  uint64_t nonce = 0;          // SendLeaseRequest.nonce
  uint64_t payload_bytes = 0;  // what follows the header
  uint32_t code = 0;           // a gRPC status code; nonzero = no payload follows
};

// "KVCXFER1", nonce, payload_bytes (u64), code (u32), 4 zero bytes; little-endian.
void EncodeHeader(const FrameHeader& header, char out[kHeaderBytes]);
// False when the bytes are not a header (wrong magic, nonzero padding, or a code with a
// payload).
bool DecodeHeader(const char in[kHeaderBytes], FrameHeader* header);

// The wire's version, in the greeting: 2 added the frame MAC trailer (frame_mac.h).
inline constexpr int kWireVersion = 2;
// "KVC-TRANSFER 2 <transfer id> <token>\n"
std::string Greeting(const std::string& transfer_id, const std::string& token);

// Writes every byte to the (non-blocking or blocking) socket `fd`, waiting for room at most
// until `deadline`. DEADLINE_EXCEEDED when the reader stops reading; UNAVAILABLE when the
// connection breaks. Never raises SIGPIPE.
absl::Status WriteAll(int fd, const void* data, size_t bytes, absl::Time deadline);
// Reads exactly `bytes` from `fd`, waiting at most until `deadline`; `give_up` (may be empty)
// is asked every 50 ms while nothing arrives and ends the wait with CANCELLED when true.
// UNAVAILABLE when the peer closes first ("after N of M bytes").
absl::Status ReadAll(int fd, void* data, size_t bytes, absl::Time deadline,
                     const std::function<bool()>& give_up = {});

}  // namespace kvc::transfer
