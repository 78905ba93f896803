#include "common/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>

#include "common/check.h"

namespace kvc {

std::string RandomId(absl::string_view prefix) {
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    KVC_CHECK(n > 0) << "getrandom failed (errno " << errno << "): cannot make an id";
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  id.reserve(prefix.size() + 2 * sizeof(bytes));
  for (uint8_t b : bytes) {
    id.push_back(kHex[b >> 4]);
    id.push_back(kHex[b & 0xf]);
  }
  return id;
}

}  // namespace kvc
