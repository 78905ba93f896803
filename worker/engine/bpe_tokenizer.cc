#include "worker/engine/bpe_tokenizer.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/pretokenizer.h"
#include "worker/engine/unicode.h"

namespace kvc::worker {
namespace {

constexpr int32_t kTokenTypeControl = 3;
constexpr int32_t kTokenTypeUserDefined = 4;

// GPT-2's reversible byte -> code point map: printable bytes map to themselves, the rest to
// U+0100 upwards, so every byte string is a printable token string.
void BuildByteMap(std::string (&to_unicode)[256], std::unordered_map<uint32_t, uint8_t>& back) {
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(next++);
    to_unicode[b].clear();
    AppendUtf8(cp, to_unicode[b]);
    back[cp] = static_cast<uint8_t>(b);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromGguf(const GgufFile& file) {
  auto model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model != "gpt2") {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.model is '", *model, "'; only byte-level BPE (gpt2)"));
  }
  auto tokens = file.GetArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  auto merges = file.GetArray("tokenizer.ggml.merges");
  if (!merges.ok()) return merges.status();

  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  tok->tokens_ = (*tokens)->strings;
  const auto n = static_cast<int64_t>(tok->tokens_.size());
  if (n == 0) return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  tok->token_types_.assign(static_cast<size_t>(n), 1);
  if (auto types = file.GetArray("tokenizer.ggml.token_type"); types.ok()) {
    if (static_cast<int64_t>((*types)->ints.size()) != n) {
      return absl::InvalidArgumentError("tokenizer.ggml.token_type length != tokens length");
    }
    for (int64_t i = 0; i < n; ++i) tok->token_types_[i] = static_cast<int32_t>((*types)->ints[i]);
  }
  tok->token_to_id_.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    tok->token_to_id_.emplace(tok->tokens_[i], static_cast<int32_t>(i));

  const std::vector<std::string>& merge_list = (*merges)->strings;
  tok->merge_rank_.reserve(merge_list.size());
  for (size_t r = 0; r < merge_list.size(); ++r) {
    const std::string& m = merge_list[r];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("merge ", r, " '", m, "' has no space"));
    }
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    const int32_t l = tok->TokenId(left), rt = tok->TokenId(right),
                  res = tok->TokenId(left + right);
    if (l < 0 || rt < 0 || res < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge ", r, " '", m, "' names unknown tokens"));
    }
    const int64_t key = static_cast<int64_t>(l) * n + rt;
    tok->merge_rank_.emplace(key, static_cast<int32_t>(r));  // first occurrence wins
    tok->merge_result_.emplace(key, res);
  }

  BuildByteMap(tok->byte_to_unicode_, tok->unicode_to_byte_);
  for (int b = 0; b < 256; ++b) {
    // -1 when the vocabulary lacks the byte (SmolLM has no tokens for some control bytes):
    // such bytes are dropped, as both llama.cpp and Hugging Face tokenizers do without an unk.
    tok->byte_token_[b] = tok->TokenId(tok->byte_to_unicode_[b]);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = tok->token_types_[i];
    if (t == kTokenTypeControl || t == kTokenTypeUserDefined) {
      tok->specials_.emplace_back(tok->tokens_[i], static_cast<int32_t>(i));
      if (!tok->tokens_[i].empty()) {
        tok->special_first_byte_[static_cast<unsigned char>(tok->tokens_[i][0])] = true;
      }
    }
  }
  std::sort(tok->specials_.begin(), tok->specials_.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  if (auto v = file.GetInt("tokenizer.ggml.bos_token_id"); v.ok())
    tok->bos_id_ = static_cast<int32_t>(*v);
  if (auto v = file.GetInt("tokenizer.ggml.eos_token_id"); v.ok())
    tok->eos_id_ = static_cast<int32_t>(*v);
  return tok;
}

int32_t BpeTokenizer::TokenId(absl::string_view token) const {
  auto it = token_to_id_.find(std::string(token));
  return it == token_to_id_.end() ? -1 : it->second;
}

bool BpeTokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && token_types_[id] == kTokenTypeControl;
}

// Classic BPE on one pre-token: start from byte tokens and repeatedly apply the lowest-ranked
// merge among adjacent pairs. Pre-tokens are short, so the quadratic scan is cheaper than a heap.
void BpeTokenizer::EncodePiece(const std::string& piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> syms;
  syms.reserve(piece.size());
  for (unsigned char b : piece) {
    if (byte_token_[b] >= 0) syms.push_back(byte_token_[b]);
  }
  const int64_t n = vocab_size();
  while (syms.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    size_t best = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto it = merge_rank_.find(static_cast<int64_t>(syms[i]) * n + syms[i + 1]);
      if (it != merge_rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == std::numeric_limits<int32_t>::max()) break;
    syms[best] = merge_result_.at(static_cast<int64_t>(syms[best]) * n + syms[best + 1]);
    syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  out.insert(out.end(), syms.begin(), syms.end());
}

std::vector<int32_t> BpeTokenizer::Encode(absl::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  auto encode_plain = [&](absl::string_view chunk) {
    for (const std::string& piece : PreTokenize(chunk)) EncodePiece(piece, out);
  };
  if (!parse_special) {
    encode_plain(text);
    return out;
  }
  size_t start = 0, pos = 0;
  while (pos < text.size()) {
    bool matched = false;
    if (special_first_byte_[static_cast<unsigned char>(text[pos])]) {
      for (const auto& [str, id] : specials_) {
        if (text.substr(pos, str.size()) == str) {
          encode_plain(text.substr(start, pos - start));
          out.push_back(id);
          pos += str.size();
          start = pos;
          matched = true;
          break;
        }
      }
    }
    if (!matched) ++pos;
  }
  encode_plain(text.substr(start));
  return out;
}

std::string BpeTokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  const std::string& tok = tokens_[id];
  if (token_types_[id] == kTokenTypeControl || token_types_[id] == kTokenTypeUserDefined) {
    return tok;
  }
  std::string bytes;
  for (uint32_t cp : DecodeUtf8(tok)) {
    auto it = unicode_to_byte_.find(cp);
    if (it != unicode_to_byte_.end()) bytes.push_back(static_cast<char>(it->second));
  }
  return bytes;
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += TokenText(id);
  return out;
}

}  // namespace kvc::worker
