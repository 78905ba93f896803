// Stream: one end of a transfer channel's TCP connection, in the clear or through TLS 1.2 or
// later (OpenSSL), with the deadline I/O both ends use (poll on the non-blocking socket).
// Under TLS, a record that fails its integrity check (bytes changed on the way) is
// DATA_LOSS, as a frame whose MAC does not match is (frame_mac.h). Owns the socket. Not
// thread-safe: one reader or writer at a time (the channel's lock); Shutdown may come from
// another thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct ssl_ctx_st;
struct ssl_st;

namespace kvc::transfer {

// An OpenSSL context: the server's certificate and key, or the CAs a client trusts.
class TlsContext {
 public:
  // The certificate chain and key of a server (the gRPC listener's PEM files). NOT_FOUND or
  // INVALID_ARGUMENT naming the file that cannot be read or used.
  static absl::StatusOr<std::shared_ptr<TlsContext>> Server(const std::string& cert_file,
                                                            const std::string& key_file);
  // A client that trusts the PEM CAs in `ca_file` and, for mTLS, presents cert/key (empty:
  // none).
  static absl::StatusOr<std::shared_ptr<TlsContext>> Client(const std::string& ca_file,
                                                            const std::string& cert_file,
                                                            const std::string& key_file);
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  ~TlsContext();

 private:
  friend class Stream;
  explicit TlsContext(ssl_ctx_st* ctx) : ctx_(ctx) {}
  ssl_ctx_st* ctx_;
};

class Stream {
 public:
  // In the clear.
  static std::unique_ptr<Stream> Plain(int fd);
  // The client's end of a TLS connection, handshaken by `deadline`: the server's certificate
  // must chain to the context's CAs and name `server_name` (a DNS name or an IP address).
  // UNAVAILABLE (with OpenSSL's reason) otherwise; the socket is closed then.
  static absl::StatusOr<std::unique_ptr<Stream>> ConnectTls(
      int fd, const std::shared_ptr<TlsContext>& context, const std::string& server_name,
      absl::Time deadline);
  // The server's end of a TLS connection, its handshake driven by Handshake() from a poll
  // loop.
  static std::unique_ptr<Stream> AcceptTls(int fd, const std::shared_ptr<TlsContext>& context);
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  int fd() const { return fd_; }
  bool tls() const { return ssl_ != nullptr; }

  // What a non-blocking step waits for next.
  enum class Want { kNothing, kRead, kWrite };
  // Server side: one step of the TLS handshake (kNothing: done, and at once for a plain
  // stream). UNAVAILABLE when the peer failed it.
  absl::StatusOr<Want> Handshake();
  // Whatever application bytes are there, without waiting: how many were read (0: none yet).
  // UNAVAILABLE at the end of the stream or on an error.
  absl::StatusOr<size_t> ReadSome(void* data, size_t bytes);
  // A short line, best effort and without waiting (a refusal before the channel closes).
  void WriteLine(const std::string& line);

  // Writes every byte, waiting for room at most until `deadline`: DEADLINE_EXCEEDED when the
  // reader stops reading, UNAVAILABLE when the connection breaks. Never raises SIGPIPE.
  absl::Status WriteAll(const void* data, size_t bytes, absl::Time deadline);
  // Reads exactly `bytes`, waiting at most until `deadline`; `give_up` (may be empty) is
  // asked every 50 ms while nothing arrives and ends the wait with CANCELLED when true.
  // UNAVAILABLE when the peer closes first; DATA_LOSS for a TLS record that fails its check.
  absl::Status ReadAll(void* data, size_t bytes, absl::Time deadline,
                       const std::function<bool()>& give_up = {});
  // Whether the peer sent something now (nothing is consumed): between frames a reader never
  // writes, so that means it hung up.
  bool Readable() const;
  // Ends the connection for both sides at once (the peer's reads and writes fail); the socket
  // stays open until the stream goes.
  void Shutdown();

 private:
  Stream(int fd, ssl_st* ssl, std::shared_ptr<TlsContext> context)
      : fd_(fd), ssl_(ssl), context_(std::move(context)) {}
  // Waits for `want` on the socket until `deadline` (and `give_up`): OK when ready.
  absl::Status Wait(Want want, absl::Time deadline, const std::function<bool()>& give_up,
                    const char* what) const;

  const int fd_;
  ssl_st* const ssl_;  // null: in the clear
  const std::shared_ptr<TlsContext> context_;
};

}  // namespace kvc::transfer
