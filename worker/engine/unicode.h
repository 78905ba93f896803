// UTF-8 decoding and the three Unicode classes the GPT-2 style pre-tokenizer regex uses
// (\p{L}, \p{N}, \s). Plain C++ on purpose: the tokenizer must not need ICU or std::regex.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kvc::worker {

// Decodes UTF-8 into code points. Invalid bytes decode as U+FFFD one byte at a time, the same
// recovery llama.cpp uses, so tokenization never fails on bad input.
std::vector<uint32_t> DecodeUtf8(absl::string_view text);

// Appends the UTF-8 encoding of `cp` to `out`.
void AppendUtf8(uint32_t cp, std::string& out);

bool IsLetter(uint32_t cp);      // \p{L}
bool IsNumber(uint32_t cp);      // \p{N}
bool IsWhitespace(uint32_t cp);  // \s

}  // namespace kvc::worker
