#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/cli/commands.h"
#include "worker/engine/chat_template.h"

namespace kvc::worker {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::unique_ptr<LocalEvictionPolicy>> ParsePolicy(const std::string& spec) {
  if (spec == "full" || spec == "none") return std::unique_ptr<LocalEvictionPolicy>();
  const std::vector<std::string> kv = absl::StrSplit(spec, absl::MaxSplits('=', 1));
  if (kv.size() == 2 && kv[0] == "window") {
    int64_t w;
    if (absl::SimpleAtoi(kv[1], &w) && w > 0) return MakeLocalWindowPolicy(w);
  }
  if (kv.size() == 2 && (kv[0] == "streaming" || kv[0] == "streaming-rerotate")) {
    const std::vector<std::string> sw = absl::StrSplit(kv[1], '+');
    int64_t s, w;
    if (sw.size() == 2 && absl::SimpleAtoi(sw[0], &s) && absl::SimpleAtoi(sw[1], &w) && s >= 0 &&
        w > 0) {
      return MakeLocalSinkWindowPolicy(s, w, /*close_gaps=*/kv[0] == "streaming-rerotate");
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "bad policy '", spec,
      "': use full, window=W, streaming=S+W or streaming-rerotate=S+W (e.g. streaming=4+1020)"));
}

int64_t DocumentTokens(const std::vector<int32_t>& document_ids, const std::vector<int32_t>& ids) {
  size_t n = 0;
  while (n < document_ids.size() && n < ids.size() && document_ids[n] == ids[n]) ++n;
  return static_cast<int64_t>(n);
}

std::string ChatDocumentPrefix(const std::string& document) {
  std::string text = ApplyChatTemplate({{"user", document}}, /*add_generation_prompt=*/false);
  const std::string tail = "<|im_end|>\n";  // what closes the user turn
  if (text.size() >= tail.size() &&
      text.compare(text.size() - tail.size(), tail.size(), tail) == 0) {
    text.resize(text.size() - tail.size());
  }
  return text;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LoadModel(const Flags& flags) {
  auto threads = flags.GetInt("threads", 0);
  if (!threads.ok()) return threads.status();
  const std::string path = flags.Get("model", kDefaultModel);
  auto model = LlamaModel::Load(path, static_cast<int>(*threads));
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat(model.status().message(),
                                     "\n(run scripts/fetch_model.sh to download the model)"));
  }
  return model;
}

#ifdef KVC_WORKER_WITH_SERVICE
std::string KvcachedTarget(const Flags& flags) { return flags.Get("target", "127.0.0.1:50051"); }

absl::StatusOr<std::unique_ptr<client::KvCacheClient>> ConnectToKvcached(const Flags& flags) {
  client::ClientOptions options;
  options.target = KvcachedTarget(flags);
  options.default_deadline = absl::Minutes(5);
  options.tls.ca_file = flags.Get("tls-ca", "");
  options.tls.cert_file = flags.Get("tls-cert", "");
  options.tls.key_file = flags.Get("tls-key", "");
  options.tls.server_name = flags.Get("tls-server-name", "");
  // The bearer token from a file or $KVC_TOKEN, never a flag value (`ps` shows those).
  const std::string token_file = flags.Get("token-file", "");
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    std::stringstream token;
    token << in.rdbuf();
    options.bearer_token = std::string(absl::StripAsciiWhitespace(token.str()));
    if (!in || options.bearer_token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file '", token_file, "' cannot be read or is empty"));
    }
  } else if (const char* env = std::getenv("KVC_TOKEN")) {
    options.bearer_token = std::string(absl::StripAsciiWhitespace(env));
  }
  return client::KvCacheClient::Connect(options);
}
#endif

}  // namespace kvc::worker
