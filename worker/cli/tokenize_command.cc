// kvc-worker tokenize: token ids of a text, one per line.
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "worker/cli/commands.h"
#include "worker/engine/bpe_tokenizer.h"
#include "worker/engine/gguf_file.h"

namespace kvc::worker {

absl::Status RunTokenize(int argc, char** argv) {
  auto flags = Flags::Parse(argc, argv, 2, {"model", "text", "text-file", "special"}, {"special"});
  if (!flags.ok()) return flags.status();
  std::string text = flags->Get("text", "");
  if (flags->Has("text-file")) {
    auto t = ReadFile(flags->Get("text-file", ""));
    if (!t.ok()) return t.status();
    text = *t;
  }
  auto file = GgufFile::Open(flags->Get("model", kDefaultModel));
  if (!file.ok()) return file.status();
  auto tok = BpeTokenizer::FromGguf(**file);
  if (!tok.ok()) return tok.status();
  for (int32_t id : (*tok)->Encode(text, flags->Has("special"))) std::cout << id << "\n";
  return absl::OkStatus();
}

}  // namespace kvc::worker
