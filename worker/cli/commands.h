// kvc-worker's subcommands and the helpers they share (flag values -> engine objects).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/cli/flags.h"
#include "worker/engine/llama_model.h"
#include "worker/engine/local_policy.h"
#ifdef KVC_WORKER_WITH_SERVICE
#include "kvc/client/kv_cache_client.h"
#endif

namespace kvc::worker {

// Each reads its flags from argv[2..] and prints results; errors come back as statuses.
absl::Status RunGenerate(int argc, char** argv);
absl::Status RunPerplexity(int argc, char** argv);
absl::Status RunPasskey(int argc, char** argv);
absl::Status RunTokenize(int argc, char** argv);
absl::Status RunAsk(int argc, char** argv);

// The model fetched by scripts/fetch_model.sh.
inline constexpr char kDefaultModel[] =
    KVC_REPO_ROOT "/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf";

absl::StatusOr<std::string> ReadFile(const std::string& path);

// Parses a local policy spec: full | window=W | streaming=S+W | streaming-rerotate=S+W.
// A null policy means the full cache. InvalidArgument on anything else.
absl::StatusOr<std::unique_ptr<LocalEvictionPolicy>> ParsePolicy(const std::string& spec);

// How many leading tokens of the prompt `ids` belong to a document it starts with: the longest
// common prefix of `ids` and `document_ids`, the tokens of the prompt's text up to the
// document's end (a token merged across the boundary goes to what follows).
int64_t DocumentTokens(const std::vector<int32_t>& document_ids, const std::vector<int32_t>& ids);
// The text of ApplyChatTemplate({{"user", document + rest}}, ...) up to the end of `document`.
std::string ChatDocumentPrefix(const std::string& document);

// --model and --threads, with a hint to fetch the model when it is missing.
absl::StatusOr<std::unique_ptr<LlamaModel>> LoadModel(const Flags& flags);

#ifdef KVC_WORKER_WITH_SERVICE
// --target: the kvcached address (default 127.0.0.1:50051).
std::string KvcachedTarget(const Flags& flags);
// A client of that kvcached, with a 5-minute default deadline (a long prompt's prefill
// through the service takes minutes on this CPU).
absl::StatusOr<std::unique_ptr<client::KvCacheClient>> ConnectToKvcached(const Flags& flags);
#endif

// Splits "a,b,c" into numbers.
template <typename T>
absl::StatusOr<std::vector<T>> ParseList(const std::string& csv) {
  std::vector<T> out;
  for (absl::string_view item : absl::StrSplit(csv, ',')) {
    double v;
    if (!absl::SimpleAtod(item, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("bad number '", item, "' in '", csv, "'"));
    }
    out.push_back(static_cast<T>(v));
  }
  return out;
}

}  // namespace kvc::worker
