#include "transfer/frame_mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <climits>
#include <vector>

namespace kvc::transfer {

struct FrameMac::State {
  EVP_CIPHER_CTX* ctx = nullptr;
  // False once a call failed (out of memory: nothing else fails here). The tag is then all
  // zeros, which no reader accepts: a frame is refused, never trusted.
  bool ok = true;
};

FrameMac::FrameMac(const std::string& key, uint64_t frame) : state_(new State) {
  unsigned char nonce[12] = {};
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<unsigned char>(frame >> (8 * i));
  state_->ctx = EVP_CIPHER_CTX_new();
  state_->ok = state_->ctx != nullptr && key.size() == kFrameKeyBytes &&
               EVP_EncryptInit_ex(state_->ctx, EVP_chacha20_poly1305(), nullptr,
                                  reinterpret_cast<const unsigned char*>(key.data()), nonce) == 1;
}

FrameMac::~FrameMac() { EVP_CIPHER_CTX_free(state_->ctx); }

void FrameMac::Update(const void* data, size_t bytes) {
  const auto* at = static_cast<const unsigned char*>(data);
  while (state_->ok && bytes > 0) {
    const size_t n = bytes > INT_MAX ? INT_MAX : bytes;
    int unused = 0;
    // Associated data (out null): authenticated, not encrypted.
    state_->ok = EVP_EncryptUpdate(state_->ctx, nullptr, &unused, at, static_cast<int>(n)) == 1;
    at += n;
    bytes -= n;
  }
}

Mac FrameMac::Finish(const void* header, size_t header_bytes) {
  Mac mac{};
  std::vector<unsigned char> sealed(header_bytes + 16);
  int written = 0, tail = 0;
  if (!state_->ok ||
      EVP_EncryptUpdate(state_->ctx, sealed.data(), &written,
                        static_cast<const unsigned char*>(header),
                        static_cast<int>(header_bytes)) != 1 ||
      EVP_EncryptFinal_ex(state_->ctx, sealed.data() + written, &tail) != 1 ||
      EVP_CIPHER_CTX_ctrl(state_->ctx, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(kMacBytes),
                          mac.data()) != 1) {
    mac.fill(0);
  }
  state_->ok = false;
  return mac;
}

bool SameMac(const Mac& a, const Mac& b) {
  // All zeros is what a failed computation gives: it matches nothing, not even itself.
  unsigned char any = 0;
  for (uint8_t byte : b) any |= byte;
  return any != 0 && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace kvc::transfer
