// The listener's credentials: plaintext, or TLS (optionally mTLS) from files that kvcached
// re-reads while it runs, so a rotated certificate reaches new connections without a restart.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "cachesvc/security/security_options.h"

namespace grpc {
class ServerCredentials;
}

namespace kvc::cachesvc {

// Reads the PEM files of `tls` once and checks them: each one readable and PEM, the
// certificate chain and the client CA bundle hold certificates, the key is the certificate's.
// gRPC would start without these checks and fail every handshake, silently. INVALID_ARGUMENT
// naming the file otherwise.
absl::Status CheckTlsFiles(const TlsOptions& tls);

// Insecure credentials when !tls.enabled(). Otherwise checks the files (CheckTlsFiles) and
// returns TLS credentials that watch them: every tls.reload_interval_seconds gRPC re-reads
// the key, the certificate chain and the client CA bundle, and new handshakes use what it
// read; established connections keep theirs. With tls.client_ca_file, clients are asked for a
// certificate verified against it (required when tls.require_client_cert).
//
// Replace the key and certificate together (a directory symlink swapped by rename, as a
// Kubernetes Secret volume does): gRPC 1.51 reads both files in one pass but does not check
// that they match, and a mismatched pair fails every new handshake until the next reload.
// gRPC 1.51 also has no floor under the interval (later releases clamp it to 1 s); below 1 s
// is INVALID_ARGUMENT here, since 0 would re-read the files in a busy loop.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls);

}  // namespace kvc::cachesvc
