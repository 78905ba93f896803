// The pre-tokenizer of SmolLM's byte-level BPE (GGUF tokenizer.ggml.pre = "smollm"): first
// every \p{N} code point becomes its own piece, then each piece is split by the GPT-2 regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Implemented by hand (as llama.cpp does) because std::regex has no Unicode classes.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kvc::worker {

// Splits `text` (UTF-8) into pre-tokens; concatenating them gives back `text` exactly.
std::vector<std::string> PreTokenize(absl::string_view text);

}  // namespace kvc::worker
