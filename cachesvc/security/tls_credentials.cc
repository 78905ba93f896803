#include "cachesvc/security/tls_credentials.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* x509) const { X509_free(x509); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read tls.", what, " '", path,
                                                   "': ", std::generic_category().message(errno)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

BioPtr MemoryBio(const std::string& data) {
  return BioPtr(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

// The first certificate of a PEM file (the leaf of a chain), and how many it holds.
absl::StatusOr<X509Ptr> ReadCertificates(const std::string& path, const char* what) {
  KVC_ASSIGN_OR_RETURN(const std::string pem, ReadFile(path, what));
  BioPtr bio = MemoryBio(pem);
  X509Ptr first(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (first == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls.", what, " '", path, "' holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
  }
  return first;
}

absl::StatusOr<PkeyPtr> ReadPrivateKey(const std::string& path) {
  KVC_ASSIGN_OR_RETURN(const std::string pem, ReadFile(path, "key_file"));
  BioPtr bio = MemoryBio(pem);
  // No passphrase callback: kvcached cannot prompt, so an encrypted key is an error here.
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, const_cast<char*>("")));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tls.key_file '", path,
                     "' holds no unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)"));
  }
  return key;
}

}  // namespace

absl::Status CheckTlsFiles(const TlsOptions& tls) {
  KVC_ASSIGN_OR_RETURN(const X509Ptr cert, ReadCertificates(tls.cert_file, "cert_file"));
  KVC_ASSIGN_OR_RETURN(const PkeyPtr key, ReadPrivateKey(tls.key_file));
  const bool match = X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!match) {
    return absl::InvalidArgumentError(
        absl::StrCat("tls.key_file '", tls.key_file, "' is not the private key of tls.cert_file '",
                     tls.cert_file, "' (the first certificate in it); use the matching pair"));
  }
  if (!tls.client_ca_file.empty()) {
    KVC_RETURN_IF_ERROR(ReadCertificates(tls.client_ca_file, "client_ca_file").status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (tls.reload_interval_seconds < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls.reload_interval_seconds is ", tls.reload_interval_seconds, "; expected at least 1"));
  }
  KVC_RETURN_IF_ERROR(CheckTlsFiles(tls));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key_file, tls.cert_file, tls.client_ca_file,
      static_cast<unsigned int>(tls.reload_interval_seconds));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    // Without require_client_cert a client may still come without a certificate (and
    // authenticate with a token); one it does present must verify.
    options.set_cert_request_type(tls.require_client_cert
                                      ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                      : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace kvc::cachesvc
