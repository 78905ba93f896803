// FrameMac: the message authentication code every frame of a TCP transfer channel carries
// (wire.h), so that a frame changed on the way, or one that is not this channel's, is
// refused (DATA_LOSS) whether or not the channel runs under TLS. The tag is the 16-byte
// Poly1305 tag of ChaCha20-Poly1305 (RFC 8439) under the channel's frame key (32 random
// bytes the server makes per channel and hands out only in the authenticated OpenTransfer
// reply), with nonce = the frame's number on the channel (0, 1, ... for every frame either
// end has written or read, as 4 zero bytes then the number as 8 little-endian bytes),
// associated data = the frame's payload and plaintext = its 32-byte header (only the tag is
// sent, after the payload). Poly1305 over the payload runs at memory-like speed, where an
// HMAC-SHA256 halved the channel's throughput.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvc::transfer {

inline constexpr size_t kFrameKeyBytes = 32;
inline constexpr size_t kMacBytes = 16;
using Mac = std::array<uint8_t, kMacBytes>;

class FrameMac {
 public:
  // `key`: the channel's frame key (kFrameKeyBytes bytes); `frame`: the frame's number.
  FrameMac(const std::string& key, uint64_t frame);
  FrameMac(const FrameMac&) = delete;
  FrameMac& operator=(const FrameMac&) = delete;
  ~FrameMac();

  // The payload, in order, in any number of pieces.
  void Update(const void* data, size_t bytes);
  // The tag over everything Update saw and the frame's header; the object is then spent.
  Mac Finish(const void* header, size_t header_bytes);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Equal, in time that does not depend on where they differ.
bool SameMac(const Mac& a, const Mac& b);

}  // namespace kvc::transfer
