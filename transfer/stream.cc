#include "transfer/stream.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transfer/wire.h"

namespace kvc::transfer {
namespace {

// OpenSSL's reason for the last failure on this thread (and clears its queue).
std::string SslError() {
  std::string why;
  for (unsigned long e; (e = ERR_get_error()) != 0;) {
    char text[256];
    ERR_error_string_n(e, text, sizeof(text));
    if (!why.empty()) why += "; ";
    why += text;
  }
  return why.empty() ? std::generic_category().message(errno) : why;
}

bool IsRecordMacFailure(unsigned long e) {
  return ERR_GET_LIB(e) == ERR_LIB_SSL &&
         (ERR_GET_REASON(e) == SSL_R_DECRYPTION_FAILED_OR_BAD_RECORD_MAC ||
          ERR_GET_REASON(e) == SSL_R_SSLV3_ALERT_BAD_RECORD_MAC ||
          ERR_GET_REASON(e) == SSL_R_TLSV1_ALERT_DECRYPTION_FAILED);
}

// A socket BIO whose writes never raise SIGPIPE (send with MSG_NOSIGNAL): OpenSSL's own
// socket BIO writes with write(2), and a peer that went away would kill the process (kvcached
// or an engine) instead of failing the write.
int BioWrite(BIO* bio, const char* data, int bytes) {
  BIO_clear_retry_flags(bio);
  const ssize_t n =
      ::send(BIO_get_fd(bio, nullptr), data, static_cast<size_t>(bytes), MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_write(bio);
  }
  return static_cast<int>(n);
}

int BioRead(BIO* bio, char* data, int bytes) {
  BIO_clear_retry_flags(bio);
  const ssize_t n = ::recv(BIO_get_fd(bio, nullptr), data, static_cast<size_t>(bytes), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_read(bio);
  }
  return static_cast<int>(n);
}

// The rest (fd get/set, flush, EOF) as OpenSSL's socket BIO does it.
long BioCtrl(BIO* bio, int cmd, long num, void* ptr) {  // NOLINT(google-runtime-int): OpenSSL's
  return BIO_meth_get_ctrl(BIO_s_socket())(bio, cmd, num, ptr);
}

int BioCreate(BIO* bio) { return BIO_meth_get_create(BIO_s_socket())(bio); }
int BioDestroy(BIO* bio) { return BIO_meth_get_destroy(BIO_s_socket())(bio); }

const BIO_METHOD* NoSigpipeSocket() {
  static BIO_METHOD* const kMethod = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
                                 "kvc socket (no SIGPIPE)");
    BIO_meth_set_write(m, BioWrite);
    BIO_meth_set_read(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_create(m, BioCreate);
    BIO_meth_set_destroy(m, BioDestroy);
    return m;
  }();
  return kMethod;
}

// Attaches `fd` to `ssl` through the BIO above (the session then owns no fd: Stream does).
bool AttachSocket(SSL* ssl, int fd) {
  BIO* bio = BIO_new(NoSigpipeSocket());
  if (bio == nullptr) return false;
  BIO_set_fd(bio, fd, BIO_NOCLOSE);
  SSL_set_bio(ssl, bio, bio);
  return true;
}

}  // namespace

absl::StatusOr<std::shared_ptr<TlsContext>> TlsContext::Server(const std::string& cert_file,
                                                               const std::string& key_file) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::ResourceExhaustedError("cannot make a TLS context");
  std::shared_ptr<TlsContext> made(new TlsContext(ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfers: cannot use certificate '", cert_file, "': ", SslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfers: cannot use key '", key_file, "': ", SslError()));
  }
  return made;
}

absl::StatusOr<std::shared_ptr<TlsContext>> TlsContext::Client(const std::string& ca_file,
                                                               const std::string& cert_file,
                                                               const std::string& key_file) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return absl::ResourceExhaustedError("cannot make a TLS context");
  std::shared_ptr<TlsContext> made(new TlsContext(ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfers: cannot use CA file '", ca_file, "': ", SslError()));
  }
  if (!cert_file.empty() &&
      (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1 ||
       SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfers: cannot use client certificate '", cert_file, "': ", SslError()));
  }
  return made;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

std::unique_ptr<Stream> Stream::Plain(int fd) {
  return std::unique_ptr<Stream>(new Stream(fd, /*ssl=*/nullptr, /*context=*/nullptr));
}

absl::StatusOr<std::unique_ptr<Stream>> Stream::ConnectTls(
    int fd, const std::shared_ptr<TlsContext>& context, const std::string& server_name,
    absl::Time deadline) {
  SSL* ssl = SSL_new(context->ctx_);
  if (ssl == nullptr) {
    ::close(fd);
    return absl::ResourceExhaustedError("cannot make a TLS session");
  }
  std::unique_ptr<Stream> stream(new Stream(fd, ssl, context));
  if (!AttachSocket(ssl, fd)) return absl::ResourceExhaustedError("cannot make a TLS socket");
  // The name the certificate must carry: an IP address is checked as one, anything else as
  // a DNS name (and sent as SNI).
  in6_addr ip6{};
  in_addr ip4{};
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (::inet_pton(AF_INET, server_name.c_str(), &ip4) == 1 ||
      ::inet_pton(AF_INET6, server_name.c_str(), &ip6) == 1) {
    X509_VERIFY_PARAM_set1_ip_asc(param, server_name.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl, server_name.c_str());
    X509_VERIFY_PARAM_set1_host(param, server_name.c_str(), 0);
  }
  for (;;) {
    const int rc = SSL_connect(ssl);
    if (rc == 1) break;
    const int e = SSL_get_error(ssl, rc);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
      const long verify = SSL_get_verify_result(ssl);
      return absl::UnavailableError(
          absl::StrCat("TLS handshake with the transfer listener failed: ",
                       verify != X509_V_OK ? X509_verify_cert_error_string(verify) : SslError()));
    }
    if (absl::Status ready = stream->Wait(e == SSL_ERROR_WANT_READ ? Want::kRead : Want::kWrite,
                                          deadline, {}, "the TLS handshake");
        !ready.ok()) {
      return ready;
    }
  }
  return stream;
}

std::unique_ptr<Stream> Stream::AcceptTls(int fd, const std::shared_ptr<TlsContext>& context) {
  SSL* ssl = SSL_new(context->ctx_);
  if (ssl != nullptr && !AttachSocket(ssl, fd)) {
    SSL_free(ssl);
    ssl = nullptr;
  }
  // A null session (with its context set) fails its first Handshake(): the caller refuses
  // the connection rather than talk in the clear.
  return std::unique_ptr<Stream>(new Stream(fd, ssl, context));
}

Stream::~Stream() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<Stream::Want> Stream::Handshake() {
  if (ssl_ == nullptr) {
    if (context_ != nullptr) return absl::UnavailableError("cannot make a TLS session");
    return Want::kNothing;
  }
  if (SSL_is_init_finished(ssl_)) return Want::kNothing;
  const int rc = SSL_accept(ssl_);
  if (rc == 1) return Want::kNothing;
  const int e = SSL_get_error(ssl_, rc);
  if (e == SSL_ERROR_WANT_READ) return Want::kRead;
  if (e == SSL_ERROR_WANT_WRITE) return Want::kWrite;
  return absl::UnavailableError(absl::StrCat("TLS handshake failed: ", SslError()));
}

absl::StatusOr<size_t> Stream::ReadSome(void* data, size_t bytes) {
  if (ssl_ == nullptr) {
    const ssize_t n = ::recv(fd_, data, bytes, MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    return absl::UnavailableError(n == 0 ? "the peer closed the connection"
                                         : std::generic_category().message(errno));
  }
  size_t got = 0;
  const int rc = SSL_read_ex(ssl_, data, bytes, &got);
  if (rc == 1) return got;
  const int e = SSL_get_error(ssl_, rc);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return 0;
  return absl::UnavailableError(e == SSL_ERROR_ZERO_RETURN ? "the peer closed the connection"
                                                           : SslError());
}

void Stream::WriteLine(const std::string& line) {
  if (ssl_ == nullptr) {
    (void)::send(fd_, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    return;
  }
  size_t written = 0;
  (void)SSL_write_ex(ssl_, line.data(), line.size(), &written);
}

absl::Status Stream::Wait(Want want, absl::Time deadline, const std::function<bool()>& give_up,
                          const char* what) const {
  for (;;) {
    if (give_up && give_up()) return absl::CancelledError(absl::StrCat(what, " was given up"));
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(what, " did not finish in time"));
    }
    pollfd p{fd_, static_cast<short>(want == Want::kWrite ? POLLOUT : POLLIN), 0};
    const int waited = static_cast<int>(
        std::min<int64_t>(give_up ? 50 : 1000, absl::ToInt64Milliseconds(left) + 1));
    const int rc = ::poll(&p, 1, waited);
    if (rc > 0) return absl::OkStatus();
    if (rc < 0 && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat(what, ": ", std::generic_category().message(errno)));
    }
  }
}

absl::Status Stream::WriteAll(const void* data, size_t bytes, absl::Time deadline) {
  if (ssl_ == nullptr) return transfer::WriteAll(fd_, data, bytes, deadline);
  const char* at = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    size_t written = 0;
    const int rc = SSL_write_ex(ssl_, at, left, &written);
    if (rc == 1) {
      at += written;
      left -= written;
      continue;
    }
    const int e = SSL_get_error(ssl_, rc);
    if (e != SSL_ERROR_WANT_WRITE && e != SSL_ERROR_WANT_READ) {
      return absl::UnavailableError(absl::StrCat("the transfer connection broke after ",
                                                 bytes - left, " of ", bytes,
                                                 " bytes: ", SslError()));
    }
    if (absl::Status ready = Wait(e == SSL_ERROR_WANT_WRITE ? Want::kWrite : Want::kRead, deadline,
                                  {}, "the reader taking the bytes");
        !ready.ok())
      return ready;
  }
  return absl::OkStatus();
}

absl::Status Stream::ReadAll(void* data, size_t bytes, absl::Time deadline,
                             const std::function<bool()>& give_up) {
  if (ssl_ == nullptr) return transfer::ReadAll(fd_, data, bytes, deadline, give_up);
  char* at = static_cast<char*>(data);
  size_t left = bytes;
  while (left > 0) {
    size_t got = 0;
    const int rc = SSL_read_ex(ssl_, at, left, &got);
    if (rc == 1) {
      at += got;
      left -= got;
      continue;
    }
    const int e = SSL_get_error(ssl_, rc);
    if (e == SSL_ERROR_ZERO_RETURN) {
      return absl::UnavailableError(absl::StrCat("the transfer connection closed after ",
                                                 bytes - left, " of ", bytes, " bytes"));
    }
    if (e == SSL_ERROR_SSL && IsRecordMacFailure(ERR_peek_error())) {
      const std::string why = SslError();
      return absl::DataLossError(absl::StrCat(
          "a TLS record of the transfer failed its integrity check (changed on the way): ", why));
    }
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
      return absl::UnavailableError(absl::StrCat("the transfer connection broke after ",
                                                 bytes - left, " of ", bytes,
                                                 " bytes: ", SslError()));
    }
    if (absl::Status ready = Wait(e == SSL_ERROR_WANT_WRITE ? Want::kWrite : Want::kRead, deadline,
                                  give_up, "the transfer's bytes arriving");
        !ready.ok())
      return ready;
  }
  return absl::OkStatus();
}

bool Stream::Readable() const {
  if (ssl_ != nullptr && SSL_pending(ssl_) > 0) return true;
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

void Stream::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

}  // namespace kvc::transfer
