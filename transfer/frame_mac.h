// FrameMac: the message authentication code every frame of a TCP transfer channel carries
// (wire.h): HMAC-SHA256, keyed by the channel's frame key (32 random bytes the server makes
// per channel and hands out only in the authenticated OpenTransfer reply), over the frame's
// header and payload, sent as a 32-byte trailer after them. A reader that finds another tag
// serves nothing of the frame (DATA_LOSS): bytes changed on the way, or a frame that is not
// this channel's, are refused whether or not the channel runs under TLS.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvc::transfer {

inline constexpr size_t kFrameKeyBytes = 32;
inline constexpr size_t kMacBytes = 32;
using Mac = std::array<uint8_t, kMacBytes>;

class FrameMac {
 public:
  // `key`: the channel's frame key (kFrameKeyBytes bytes).
  explicit FrameMac(const std::string& key);
  FrameMac(const FrameMac&) = delete;
  FrameMac& operator=(const FrameMac&) = delete;
  ~FrameMac();

  void Update(const void* data, size_t bytes);
  // The tag of everything Update saw; the object is then spent.
  Mac Finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Equal, in time that does not depend on where they differ.
bool SameMac(const Mac& a, const Mac& b);

}  // namespace kvc::transfer
