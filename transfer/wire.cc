#include "transfer/wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/errno_message.h"

namespace kvc::transfer {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'C', 'X', 'F', 'E', 'R', '1'};

void PutLe(uint64_t v, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t GetLe(const char* in, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

// Milliseconds poll may wait: until the deadline, in slices of at most `slice_ms`.
int WaitMs(absl::Time deadline, int slice_ms) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, slice_ms));
}

}  // namespace

void EncodeHeader(const FrameHeader& header, char out[kHeaderBytes]) {
  std::memcpy(out, kMagic, sizeof(kMagic));
  PutLe(header.nonce, 8, out + 8);
  PutLe(header.payload_bytes, 8, out + 16);
  PutLe(header.code, 4, out + 24);
  PutLe(0, 4, out + 28);
}

bool DecodeHeader(const char in[kHeaderBytes], FrameHeader* header) {
  if (std::memcmp(in, kMagic, sizeof(kMagic)) != 0 || GetLe(in + 28, 4) != 0) return false;
  header->nonce = GetLe(in + 8, 8);
  header->payload_bytes = GetLe(in + 16, 8);
  header->code = static_cast<uint32_t>(GetLe(in + 24, 4));
  return header->code == 0 || header->payload_bytes == 0;
}

std::string Greeting(const std::string& transfer_id, const std::string& token) {
  return absl::StrCat("KVC-TRANSFER ", kWireVersion, " ", transfer_id, " ", token, "\n");
}

absl::Status WriteAll(int fd, const void* data, size_t bytes, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::send(fd, p + done, bytes - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("the transfer connection broke after ", done,
                                                 " of ", bytes, " bytes: ", ErrnoMessage()));
    }
    pollfd pfd{fd, POLLOUT, 0};
    const int wait = WaitMs(deadline, 1000);
    if (wait == 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the transfer's reader stopped reading after ", done, " of ", bytes, " bytes"));
    }
    if (::poll(&pfd, 1, wait) < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("transfer connection: poll: ", ErrnoMessage()));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t bytes, absl::Time deadline,
                     const std::function<bool()>& give_up) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::recv(fd, p + done, bytes - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat("the transfer connection closed after ", done, " of ", bytes, " bytes"));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("the transfer connection broke after ", done,
                                                 " of ", bytes, " bytes: ", ErrnoMessage()));
    }
    if (give_up && give_up()) return absl::CancelledError("the transfer was given up");
    const int wait = WaitMs(deadline, 50);
    if (wait == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("the transfer stalled after ", done, " of ", bytes, " bytes"));
    }
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, wait) < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("transfer connection: poll: ", ErrnoMessage()));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvc::transfer
