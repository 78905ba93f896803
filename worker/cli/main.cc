// kvc-worker: runs the reference engine with its KV cache in a local cache or in kvcached
// (--kv=kvcached; the service-backed cache comes with the client library).
//   kvc-worker generate   --prompt TEXT | --prompt-file FILE [--question Q] [--policy P] ...
//   kvc-worker perplexity --text-file FILE [--max-tokens N] [--policies P1,P2,...] [--json OUT]
//   kvc-worker passkey    [--haystack-file FILE] [--lengths L1,L2] [--depths D1,D2] ...
//   kvc-worker tokenize   --text TEXT | --text-file FILE
//   kvc-worker ask        --prompt-file DOC --questions-file FILE [--reuse] (kvcached)
// Policies (local baselines): full | window=W | streaming=S+W (S sinks + W recent tokens) |
// streaming-rerotate=S+W (the same, sinks re-rotated next to the window).
#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "worker/cli/commands.h"

namespace kvc::worker {
namespace {

int Main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  absl::Status s;
  if (cmd == "generate") {
    s = RunGenerate(argc, argv);
  } else if (cmd == "perplexity") {
    s = RunPerplexity(argc, argv);
  } else if (cmd == "passkey") {
    s = RunPasskey(argc, argv);
  } else if (cmd == "tokenize") {
    s = RunTokenize(argc, argv);
  } else if (cmd == "ask") {
    s = RunAsk(argc, argv);
  } else {
    std::cerr
        << "usage: kvc-worker generate|perplexity|passkey|tokenize|ask [flags]\n"
           "  generate   --prompt TEXT | --prompt-file FILE [--question Q] [--raw]\n"
           "             [--kv local|kvcached --target HOST:PORT --pool NAME]\n"
           "             [--policy full|window=W|streaming=S+W|streaming-rerotate=S+W]  (local)\n"
           "             [--policy "
           "full|streaming[-rerotate]=S+W|[ada]snapkv=B[/W[/K]]|[ada]pyramidkv=B[/W[/K]]|\n"
           "              [ada]expattn=B[/W]|h2o=H+R]  (kvcached; expattn: Expected Attention,\n"
           "              query-agnostic: with --question it compresses the document alone)\n"
           "             [--storage f16|fp8|int8|int4|int4g64|nvfp4]  (kvcached)\n"
           "             [--max-new-tokens N]\n"
           "             [--temperature T --top-k K --top-p P --seed S]\n"
           "             [--attention store|fetch] [--threads N] [--model GGUF]\n"
           "  perplexity --text-file FILE [--max-tokens N] [--skip-tokens N] [--chunk C]\n"
           "             [--policies full,window=1024,streaming=4+1020] [--json OUT]\n"
           "             [--kv local|kvcached --target HOST:PORT --storage F]\n"
           "  passkey    [--haystack-file FILE] [--lengths 1024,2048] [--depths 0,0.5,1]\n"
           "             [--keys N] [--answer-tokens N (8)] [--key-tokens] [--chat]\n"
           "             [--cases-out FILE]  (write the cases' token ids as JSON lines; no run)\n"
           "             [--question-in-prompt]\n"
           "             [--json OUT]\n"
           "             [--policies full,window=512,streaming=4+508]  (local)\n"
           "             [--kv kvcached --target HOST:PORT --pool NAME\n"
           "              --policies full,full:fp8,snapkv=1024:int4,expattn=256:int4,h2o=H+R,\n"
           "              streaming=S+W]  (expattn compresses the context before the question)\n"
           "  tokenize   --text TEXT | --text-file FILE [--special]\n"
           "  ask        --prompt-file DOC --questions-file FILE (one per line) [--reuse]\n"
           "             --kv kvcached --target HOST:PORT [--model-id ID] [--salt S]\n"
           "             [--policy P --storage F] [--max-new-tokens N (32)] [--json OUT]\n"
           "  with --kv kvcached: [--tls-ca FILE [--tls-cert F --tls-key F] [--tls-server-name "
           "N]]\n"
           "             [--token-file FILE]  (or $KVC_TOKEN)\n";
    return 2;
  }
  if (!s.ok()) {
    std::cerr << "kvc-worker: " << s << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvc::worker

int main(int argc, char** argv) { return kvc::worker::Main(argc, argv); }
