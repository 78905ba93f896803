#include "transfer/frame_mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace kvc::transfer {

struct FrameMac::State {
  HMAC_CTX* ctx = nullptr;
  // False once a call failed (out of memory: nothing else fails here). The tag is then all
  // zeros, which no reader accepts: a frame is refused, never trusted.
  bool ok = true;
};

// HMAC_CTX is deprecated in OpenSSL 3 in favour of EVP_MAC, which costs a provider lookup per
// frame; the one-shot HMAC_* calls here are what both ends of every frame run.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

FrameMac::FrameMac(const std::string& key) : state_(new State) {
  state_->ctx = HMAC_CTX_new();
  state_->ok =
      state_->ctx != nullptr && HMAC_Init_ex(state_->ctx, key.data(), static_cast<int>(key.size()),
                                             EVP_sha256(), nullptr) == 1;
}

FrameMac::~FrameMac() { HMAC_CTX_free(state_->ctx); }

void FrameMac::Update(const void* data, size_t bytes) {
  if (state_->ok && bytes > 0) {
    state_->ok = HMAC_Update(state_->ctx, static_cast<const unsigned char*>(data), bytes) == 1;
  }
}

Mac FrameMac::Finish() {
  Mac mac{};
  unsigned int length = 0;
  if (!state_->ok || HMAC_Final(state_->ctx, mac.data(), &length) != 1 || length != kMacBytes) {
    mac.fill(0);
  }
  state_->ok = false;
  return mac;
}

#pragma GCC diagnostic pop

bool SameMac(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace kvc::transfer
