#include "client/src/transfer_reader.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/errno_message.h"
#include "transfer/frame_mac.h"
#include "transfer/wire.h"

namespace kvc::client::internal {

ArenaLookup ReceivedBlocks::arenas() const {
  return [this](StorageFormat f) -> absl::StatusOr<ArenaView> {
    const auto i = static_cast<int>(f);
    if (i < 1 || i >= transfer::kMaxFormats) return absl::InternalError("unknown storage format");
    return ArenaView{payload.get() + layout.offset(i), layout.bytes(i)};
  };
}

absl::StatusOr<ReceivedBlocks> PlanReceive(const Lease& lease) {
  absl::StatusOr<PayloadPlan> plan = PlanPayload(lease);
  if (!plan.ok()) return plan.status();
  ReceivedBlocks r;
  r.lease = std::move(plan->lease);
  r.layout = plan->layout;
  r.bytes = plan->layout.total_bytes();
  return r;
}

absl::StatusOr<std::unique_ptr<TransferReader>> TransferReader::Connect(
    const TransferEndpoint& at) {
  const std::string& host = at.host;
  const int port = at.port;
  const std::string where =
      absl::StrCat(absl::StrContains(host, ':') ? absl::StrCat("[", host, "]") : host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("transfer ", where, ": ", ::gai_strerror(rc)));
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    // Non-blocking, so that an address that drops packets costs seconds, not minutes.
    bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!connected && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      if (::poll(&p, 1, 5000) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0) {
        connected = err == 0;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (!connected) {
      why = ErrnoMessage();
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to transfer ", where, ": ", why));
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // No SO_RCVBUF: setting it turns off the kernel's receive-window autotuning and is capped at
  // net.core.rmem_max (208 KiB by default).
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  std::unique_ptr<transfer::Stream> stream;
  if (at.tls != nullptr) {
    absl::StatusOr<std::unique_ptr<transfer::Stream>> tls =
        transfer::Stream::ConnectTls(fd, at.tls, at.server_name, deadline);
    if (!tls.ok()) {
      return absl::UnavailableError(absl::StrCat("transfer ", where, ": ", tls.status().message()));
    }
    stream = *std::move(tls);
  } else {
    stream = transfer::Stream::Plain(fd);
  }
  const std::string greeting = transfer::Greeting(at.transfer_id, at.token);
  absl::Status st = stream->WriteAll(greeting.data(), greeting.size(), deadline);
  std::string reply;
  while (st.ok() && (reply.empty() || reply.back() != '\n') && reply.size() < 256) {
    char c = 0;
    st = stream->ReadAll(&c, 1, deadline);
    reply.push_back(c);
  }
  if (!st.ok() || reply != "OK\n") {
    if (!st.ok())
      return absl::UnavailableError(absl::StrCat("transfer ", where, ": ", st.message()));
    return absl::FailedPreconditionError(absl::StrCat(
        "transfer ", where, " refused: ", absl::StripSuffix(reply.substr(0, 200), "\n")));
  }
  std::random_device rd;
  const uint64_t first = rd() ^ (static_cast<uint64_t>(rd()) << 32);
  return std::unique_ptr<TransferReader>(new TransferReader(
      std::move(stream), at.transfer_id, at.tls != nullptr ? absl::StrCat(where, ", TLS") : where,
      at.frame_key, first));
}

TransferReader::~TransferReader() = default;

void TransferReader::Break() {
  broken_.store(true, std::memory_order_relaxed);
  // shutdown, not close: the server's write fails at once instead of stalling; the socket is
  // closed with the reader.
  stream_->Shutdown();
}

bool TransferReader::Alive() {
  if (broken_.load(std::memory_order_relaxed)) return false;
  kvc::MutexLock lock(&mu_);  // not during a Fetch's read: that one will tell
  // The server writes only what a SendLease asked for: readable between Fetches means it
  // hung up.
  return !stream_->Readable();
}

absl::StatusOr<ReceivedBlocks> TransferReader::Fetch(
    const Lease& lease, const std::function<absl::Status(uint64_t nonce)>& send,
    absl::Time deadline) {
  absl::StatusOr<ReceivedBlocks> planned = PlanReceive(lease);
  if (!planned.ok()) return planned.status();
  ReceivedBlocks r = *std::move(planned);
  kvc::MutexLock lock(&mu_);
  if (broken_.load(std::memory_order_relaxed)) {
    return absl::UnavailableError(absl::StrCat("transfer ", where_, " broke earlier"));
  }
  const uint64_t nonce = ++nonce_;
  std::atomic<bool> sent_failed{false};
  absl::Status sent;
  std::thread call([&] {
    sent = send(nonce);
    if (!sent.ok()) sent_failed.store(true, std::memory_order_release);
  });
  // The call failing before any frame came means none may come (the server never reached the
  // channel) or one may still be on its way: either way the stream cannot be trusted after.
  const auto give_up = [&] { return sent_failed.load(std::memory_order_acquire); };
  char raw[transfer::kHeaderBytes];
  transfer::FrameHeader header;
  transfer::FrameMac mac(frame_key_, frames_++);  // every frame read counts
  absl::Status read = stream_->ReadAll(raw, sizeof(raw), deadline, give_up);
  if (read.ok() && (!transfer::DecodeHeader(raw, &header) || header.nonce != nonce)) {
    read = absl::InternalError(absl::StrCat("transfer ", where_, " is out of step"));
  }
  if (read.ok() && header.code == 0) {
    if (header.payload_bytes != static_cast<uint64_t>(r.bytes)) {
      read = absl::InternalError(absl::StrCat("transfer ", where_, " sends ", header.payload_bytes,
                                              " bytes for a lease of ", r.bytes));
    } else {
      if (spare_ != nullptr && spare_bytes_ >= r.bytes) {
        r.payload = std::move(spare_);
        r.capacity = spare_bytes_;
        spare_bytes_ = 0;
      } else {
        r.capacity = std::max<int64_t>(r.bytes, 1);
        r.payload.reset(new uint8_t[static_cast<size_t>(r.capacity)]);
      }
      // In pieces that stay in cache between the read and the MAC's pass over them: one
      // pass over the whole payload after it came would read it from memory again.
      constexpr size_t kMacPiece = 256 << 10;
      uint8_t* at = r.payload.get();
      for (size_t left = static_cast<size_t>(r.bytes); read.ok() && left > 0;) {
        const size_t n = std::min(left, kMacPiece);
        read = stream_->ReadAll(at, n, deadline);
        if (read.ok()) mac.Update(at, n);
        at += n;
        left -= n;
      }
    }
  }
  if (read.ok()) {
    // The frame's MAC: whatever came is served only if it is what the server sent.
    transfer::Mac tag{};
    read = stream_->ReadAll(tag.data(), tag.size(), deadline);
    if (read.ok() && !transfer::SameMac(tag, mac.Finish(raw, sizeof(raw)))) {
      read = absl::DataLossError(
          absl::StrCat("transfer ", where_,
                       ": a frame's MAC does not match its bytes (changed on the way, "
                       "or not this channel's); nothing of it is used"));
    }
  }
  if (!read.ok()) Break();
  call.join();
  if (!sent.ok()) {
    // A refusal the server announced in the frame leaves the stream in step; any other
    // failure of the call does not. A frame that failed its check is the answer, whatever
    // the call says.
    if (!read.ok() || header.code == 0) Break();
    if (absl::IsDataLoss(read)) return read;
    return sent;
  }
  if (!read.ok()) return read;
  if (header.code != 0) {
    Break();
    return absl::InternalError("the server announced a refusal but SendLease succeeded");
  }
  return r;
}

void TransferReader::Recycle(ReceivedBlocks blocks) {
  if (blocks.payload == nullptr || blocks.capacity > kMaxSpareBytes) return;
  kvc::MutexLock lock(&mu_);
  if (blocks.capacity > spare_bytes_) {
    spare_ = std::move(blocks.payload);
    spare_bytes_ = blocks.capacity;
  }
}

}  // namespace kvc::client::internal
