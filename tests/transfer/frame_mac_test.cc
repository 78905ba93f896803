// The frame MAC (transfer/frame_mac.h): the tag every TCP transfer frame carries, as both
// readers compute it (the Python reader with the cryptography package: the golden tag below
// is what its ChaCha20Poly1305 gives), and what it refuses.
#include "transfer/frame_mac.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvc::transfer {
namespace {

std::string Key() {
  std::string key(kFrameKeyBytes, '\0');
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<char>(i);
  return key;
}

std::vector<uint8_t> Payload() {
  std::vector<uint8_t> p(1000);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i);
  return p;
}

// The tag of frame `frame` with `payload` fed in pieces of `piece` bytes and a header of 32
// bytes 0xAA.
Mac Tag(const std::string& key, uint64_t frame, const std::vector<uint8_t>& payload, size_t piece) {
  const std::vector<uint8_t> header(32, 0xAA);
  FrameMac mac(key, frame);
  for (size_t at = 0; at < payload.size(); at += piece) {
    mac.Update(payload.data() + at, std::min(piece, payload.size() - at));
  }
  return mac.Finish(header.data(), header.size());
}

std::string Hex(const Mac& mac) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : mac) {
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

TEST(FrameMacTest, IsChaCha20Poly1305WithTheFrameNumberAsNonce) {
  // ChaCha20Poly1305(bytes(range(32))).encrypt(bytes(4) + (5).to_bytes(8, "little"),
  //     b"\xaa" * 32, bytes(i % 256 for i in range(1000)))[-16:]
  EXPECT_EQ(Hex(Tag(Key(), 5, Payload(), 1000)), "24cfc653398cc270003e2d956f350f77");
}

TEST(FrameMacTest, PiecesGiveTheTagOfTheWhole) {
  const Mac whole = Tag(Key(), 5, Payload(), 1000);
  for (size_t piece : {1, 7, 64, 999}) EXPECT_TRUE(SameMac(Tag(Key(), 5, Payload(), piece), whole));
}

TEST(FrameMacTest, AnotherFrameNumberKeyOrPayloadGivesAnotherTag) {
  const Mac tag = Tag(Key(), 5, Payload(), 1000);
  // A frame replayed, or moved to another place on its channel, is refused.
  EXPECT_FALSE(SameMac(Tag(Key(), 6, Payload(), 1000), tag));
  std::string other_key = Key();
  other_key[31] ^= 1;
  EXPECT_FALSE(SameMac(Tag(other_key, 5, Payload(), 1000), tag));
  std::vector<uint8_t> changed = Payload();
  changed[999] ^= 0x80;
  EXPECT_FALSE(SameMac(Tag(Key(), 5, changed, 1000), tag));
  std::vector<uint8_t> header(32, 0xAA);
  header[0] = 0xAB;
  FrameMac mac(Key(), 5);
  mac.Update(Payload().data(), Payload().size());
  EXPECT_FALSE(SameMac(mac.Finish(header.data(), header.size()), tag));
}

TEST(FrameMacTest, AKeyOfTheWrongSizeGivesATagNothingAccepts) {
  const Mac zeros{};
  const Mac tag = Tag("short", 5, Payload(), 1000);
  EXPECT_EQ(Hex(tag), Hex(zeros));
  EXPECT_FALSE(SameMac(tag, tag));  // all zeros matches nothing, not even itself
}

}  // namespace
}  // namespace kvc::transfer
