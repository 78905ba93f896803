#include "cachesvc/transport/tcp_channels.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cachesvc/core/base/quote.h"
#include "common/errno_message.h"
#include "common/logging.h"
#include "common/random_id.h"
#include "common/status_macros.h"
#include "transfer/frame_mac.h"
#include "transfer/stream.h"
#include "transfer/wire.h"

namespace kvc::cachesvc {
namespace {

// Equal without an early exit: how long a comparison takes says nothing about the token.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// What the per-peer limit counts: the IPv4 address, or the /64 of an IPv6 one (a host is
// commonly given a whole /64, so its single addresses would not limit it).
std::string PeerOf(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(addr);
    ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
    return text;
  }
  if (addr.ss_family == AF_INET6) {
    in6_addr prefix = reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr;
    const bool v4 = IN6_IS_ADDR_V4MAPPED(&prefix);  // an IPv4 peer of a dual-stack listener
    if (!v4) std::memset(&prefix.s6_addr[8], 0, 8);
    ::inet_ntop(AF_INET6, &prefix, text, sizeof(text));
    return v4 ? std::string(text) : absl::StrCat(text, "/64");
  }
  return "?";
}

// The stamp of the files a TLS context was made from: a changed one is reloaded.
std::string FileStamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "missing";
  return absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

// Writes a frame into the channel's connection: the header, then the blocks, each also fed to
// the frame's MAC; Finish writes the MAC's tag after them (transfer/frame_mac.h).
class ConnectionSink final : public BlockSink {
 public:
  // `frame`: the frame's number on the channel (its MAC's nonce).
  ConnectionSink(transfer::Stream* stream, const std::string& key, uint64_t frame, uint64_t nonce,
                 absl::Time deadline)
      : stream_(stream), mac_(key, frame), nonce_(nonce), deadline_(deadline) {}
  absl::Status Begin(int64_t /*blocks*/, int64_t bytes) override {
    transfer::EncodeHeader({nonce_, static_cast<uint64_t>(bytes), 0}, header_);
    begun_ = true;
    return stream_->WriteAll(header_, sizeof(header_), deadline_);
  }
  absl::Status Write(const char* data, size_t bytes) override {
    mac_.Update(data, bytes);
    return stream_->WriteAll(data, bytes, deadline_);
  }
  absl::Status Finish() {
    const transfer::Mac tag = mac_.Finish(header_, sizeof(header_));
    return stream_->WriteAll(tag.data(), tag.size(), deadline_);
  }
  bool begun() const { return begun_; }

 private:
  transfer::Stream* const stream_;
  transfer::FrameMac mac_;
  const uint64_t nonce_;
  const absl::Time deadline_;
  char header_[transfer::kHeaderBytes] = {};
  bool begun_ = false;
};

}  // namespace

TcpChannels::Channel::~Channel() {
  kvc::MutexLock lock(&send_mu);
  stream.reset();  // closes the connection
}

absl::StatusOr<std::unique_ptr<TcpChannels>> TcpChannels::Start(const TcpChannelOptions& options,
                                                                LeaseService* leases) {
  std::unique_ptr<TcpChannels> t(new TcpChannels(options, leases));
  if (!options.tls_cert_file.empty()) {
    t->tls_stamp_ =
        absl::StrCat(FileStamp(options.tls_cert_file), "|", FileStamp(options.tls_key_file));
    KVC_ASSIGN_OR_RETURN(t->tls_,
                         transfer::TlsContext::Server(options.tls_cert_file, options.tls_key_file));
  }
  const auto colon = options.listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == options.listen.size()) {
    return absl::InvalidArgumentError(absl::StrCat("transfer_listen ", Quoted(options.listen),
                                                   " is not host:port (e.g. 0.0.0.0:50061)"));
  }
  std::string host = options.listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port = options.listen.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc =
          ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer_listen ", Quoted(options.listen), ": ", ::gai_strerror(rc)));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && t->listen_fd_ < 0; a = a->ai_next) {
    // Non-blocking: Admit accepts until the backlog is empty.
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      t->listen_fd_ = fd;
    } else {
      why = ErrnoMessage();
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (t->listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for transfers on ", Quoted(options.listen), ": ", why));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(t->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  t->port_ =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  t->wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (t->wake_fd_ < 0) return absl::UnavailableError(absl::StrCat("eventfd: ", ErrnoMessage()));
  t->thread_ = std::thread([p = t.get()] { p->Serve(); });
  return t;
}

TcpChannels::~TcpChannels() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

absl::StatusOr<OpenedTransfer> TcpChannels::Open(const TenantScope& scope,
                                                 const std::string& /*pool*/) {
  const std::string token = RandomId("");
  auto channel = std::make_shared<Channel>();
  channel->scope = scope;
  channel->token = token;
  channel->frame_key = absl::HexStringToBytes(absl::StrCat(RandomId(""), RandomId("")));
  channel->opened = absl::Now();
  OpenedTransfer o;
  o.frame_key = channel->frame_key;
  o.tls = tls_ != nullptr;
  const absl::Time now = absl::Now();
  KVC_ASSIGN_OR_RETURN(o.id,
                       channels_.Add(std::move(channel), [&](Channel& c) { return Done(c, now); }));
  o.token = token;
  o.host = options_.advertise_host;
  o.port = port_;
  o.connect_within_ms = absl::ToInt64Milliseconds(options_.connect_within);
  Event("opened");
  return o;
}

bool TcpChannels::Done(Channel& c, absl::Time now) {
  if (!c.send_mu.TryLock()) return false;  // sending: in use
  bool done = false;
  if (c.stream == nullptr) {
    done = now - c.opened > options_.connect_within;
  } else {
    // A reader never writes after its greeting: readable means it hung up.
    done = c.broken || c.stream->Readable();
  }
  c.send_mu.Unlock();
  if (done) Event("closed");
  return done;
}

absl::Status TcpChannels::Close(const TenantScope& scope, const std::string& id) {
  KVC_RETURN_IF_ERROR(channels_.Close(scope, id));
  Event("closed");
  return absl::OkStatus();  // the connection closes when the last send on it is done
}

absl::StatusOr<SentBlocks> TcpChannels::Send(const TenantScope& scope, const std::string& id,
                                             const std::string& lease_id, uint64_t nonce,
                                             absl::Time deadline) {
  std::shared_ptr<Channel> c = channels_.Find(scope, id);
  if (c == nullptr) return ScopedChannels<Channel>::Unknown(id);
  kvc::MutexLock lock(&c->send_mu);
  if (c->broken) {
    return absl::UnavailableError(
        absl::StrCat("transfer ", Quoted(id), " broke in an earlier send; open another"));
  }
  if (c->stream == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "transfer ", Quoted(id), " is not connected yet: connect and greet before SendLease"));
  }
  const absl::Time until = std::min(deadline, absl::Now() + options_.write_stall);
  const uint64_t frame = c->frames++;  // every frame written counts, refusals too
  ConnectionSink sink(c->stream.get(), c->frame_key, frame, nonce, until);
  absl::StatusOr<SentBlocks> sent = SendLeasedBlocks(*leases_, scope, lease_id, &sink);
  if (sent.ok()) {
    const absl::Status tagged = sink.Finish();
    if (tagged.ok()) {
      Event("sent");
      return sent;
    }
    sent = tagged;
  }
  Event("failed");
  if (!sink.begun()) {
    // Nothing of a payload went out: a header with the code (and its MAC) keeps the channel
    // in step.
    char header[transfer::kHeaderBytes];
    transfer::EncodeHeader({nonce, 0, static_cast<uint32_t>(sent.status().code())}, header);
    transfer::FrameMac mac(c->frame_key, frame);
    const transfer::Mac tag = mac.Finish(header, sizeof(header));
    if (c->stream->WriteAll(header, sizeof(header), until).ok() &&
        c->stream->WriteAll(tag.data(), tag.size(), until).ok()) {
      return sent.status();
    }
  }
  c->broken = true;
  c->stream->Shutdown();  // the reader sees the channel end at once
  return sent.status();
}

std::shared_ptr<transfer::TlsContext> TcpChannels::TlsForNewConnection() {
  if (tls_ == nullptr) return nullptr;
  const std::string stamp =
      absl::StrCat(FileStamp(options_.tls_cert_file), "|", FileStamp(options_.tls_key_file));
  if (stamp != tls_stamp_) {
    tls_stamp_ = stamp;  // one attempt (and one log line) per change
    absl::StatusOr<std::shared_ptr<transfer::TlsContext>> reloaded =
        transfer::TlsContext::Server(options_.tls_cert_file, options_.tls_key_file);
    if (reloaded.ok()) {
      tls_ = *std::move(reloaded);
      KVC_LOG(INFO) << "transfers: reloaded the TLS certificate " << options_.tls_cert_file;
    } else {
      KVC_LOG(ERROR) << "transfers: the TLS files changed but cannot be used; the previous "
                     << "certificate stays in force: " << reloaded.status().message();
    }
  }
  return tls_;
}

void TcpChannels::Serve() {
  std::vector<Pending> pending;
  for (;;) {
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const Pending& p : pending) {
      fds.push_back(
          {p.stream->fd(),
           static_cast<short>(p.want == transfer::Stream::Want::kWrite ? POLLOUT : POLLIN), 0});
    }
    if (::poll(fds.data(), fds.size(), 500) < 0) {
      if (errno == EINTR) continue;
      KVC_LOG(ERROR) << "transfer listener: poll failed: " << ErrnoMessage();
      break;
    }
    if (fds[0].revents != 0) break;
    const absl::Time now = absl::Now();
    std::vector<Pending> kept;
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (fds[i + 2].revents != 0 && Greet(p)) continue;
      if (now - p.accepted > options_.greeting_within) {
        Event("refused");
        p.stream->WriteLine("ERR no greeting in time\n");
        continue;  // the stream closes with it
      }
      kept.push_back(std::move(p));
    }
    pending = std::move(kept);
    if (fds[1].revents & POLLIN) Admit(pending, now);
  }
}

void TcpChannels::Admit(std::vector<Pending>& pending, absl::Time now) {
  // At most a backlog's worth per round, so the greetings waiting are read in between.
  for (int round = 0; round < 64; ++round) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN: nothing more waits
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const std::shared_ptr<transfer::TlsContext> tls = TlsForNewConnection();
    std::unique_ptr<transfer::Stream> stream =
        tls != nullptr ? transfer::Stream::AcceptTls(fd, tls) : transfer::Stream::Plain(fd);
    std::string peer = PeerOf(addr);
    int from_peer = 0;
    for (const Pending& p : pending) from_peer += p.peer == peer ? 1 : 0;
    if (from_peer >= options_.max_ungreeted_per_peer) {
      Event("refused");
      // A TLS peer has not shaken hands yet: it sees the connection close, no line.
      if (!stream->tls()) {
        stream->WriteLine(
            absl::StrCat("ERR too many connections from ", peer, " waiting to greet\n"));
      }
      continue;  // the stream closes the connection
    }
    if (static_cast<int>(pending.size()) >= options_.max_ungreeted && !pending.empty()) {
      // The oldest has had the longest to greet; dropping it instead of refusing the new one
      // means a flood delays a reader that greets at once by nothing.
      Event("refused");
      pending.front().stream->WriteLine("ERR dropped: too many connections waiting to greet\n");
      pending.erase(pending.begin());
    }
    Pending p;
    p.stream = std::move(stream);
    p.accepted = now;
    p.peer = std::move(peer);
    pending.push_back(std::move(p));
  }
}

bool TcpChannels::Greet(Pending& p) {
  // Under TLS, the handshake first (a few round trips, driven by the poll loop).
  absl::StatusOr<transfer::Stream::Want> want = p.stream->Handshake();
  if (!want.ok()) {
    Event("refused");
    return true;  // the stream closes the connection
  }
  if (*want != transfer::Stream::Want::kNothing) {
    p.want = *want;
    return false;
  }
  p.want = transfer::Stream::Want::kRead;
  char buf[transfer::kMaxGreetingBytes];
  for (;;) {
    absl::StatusOr<size_t> n = p.stream->ReadSome(buf, sizeof(buf));
    if (!n.ok()) return true;  // the peer went away
    if (*n == 0) break;
    p.line.append(buf, *n);
    if (p.line.size() >= transfer::kMaxGreetingBytes) break;
  }
  const auto end = p.line.find('\n');
  if (end == std::string::npos) {
    if (p.line.size() < transfer::kMaxGreetingBytes) return false;
    Event("refused");
    p.stream->WriteLine("ERR greeting too long\n");
    return true;
  }
  const std::vector<std::string> words = absl::StrSplit(p.line.substr(0, end), ' ');
  std::string why =
      absl::StrCat("expected: KVC-TRANSFER ", transfer::kWireVersion, " <transfer id> <token>");
  if (words.size() == 4 && words[0] == "KVC-TRANSFER" &&
      words[1] == absl::StrCat(transfer::kWireVersion) && end + 1 == p.line.size()) {
    why = "unknown transfer or wrong token";
    const std::shared_ptr<Channel> found = channels_.FindById(words[2]);
    if (found != nullptr && SameSecret(found->token, words[3])) {
      Channel& c = *found;
      // A channel that is sending is connected already; never wait for it here.
      if (c.send_mu.TryLock()) {
        const bool fresh = c.stream == nullptr;
        if (fresh) {
          // Counted before the reply (here and below), so that whoever has read a reply sees
          // it counted (TransferTest reads the metric right after the refusal).
          Event("connected");
          p.stream->WriteLine("OK\n");
          c.stream = std::move(p.stream);
        }
        c.send_mu.Unlock();
        if (fresh) return true;
      }
      why = "this transfer is connected already";
    }
  }
  Event("refused");
  p.stream->WriteLine(absl::StrCat("ERR ", why, "\n"));
  return true;
}

}  // namespace kvc::cachesvc
