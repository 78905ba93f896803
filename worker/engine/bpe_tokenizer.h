// Byte-level BPE tokenizer built from GGUF metadata (tokenizer.ggml.model = "gpt2"): the token
// list, the merge list (rank = position) and the token types; control tokens such as
// <|im_start|> are matched as whole tokens in the text when `parse_special` is set.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/engine/gguf_file.h"

namespace kvc::worker {

class BpeTokenizer {
 public:
  // Reads tokenizer.ggml.{model,tokens,merges,token_type,bos_token_id,eos_token_id}.
  // InvalidArgument when the model is not "gpt2" or a merge names an unknown token.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromGguf(const GgufFile& file);

  // Encodes UTF-8 text. With `parse_special`, control-token strings in the text become their
  // ids (how chat prompts are built); without it they are tokenized as plain text.
  std::vector<int32_t> Encode(absl::string_view text, bool parse_special) const;

  // Text of the ids (control tokens verbatim). Ids outside the vocabulary are skipped.
  std::string Decode(const std::vector<int32_t>& ids) const;
  std::string TokenText(int32_t id) const;

  // Id of an exact token string, or -1.
  int32_t TokenId(absl::string_view token) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  bool IsControl(int32_t id) const;

 private:
  BpeTokenizer() = default;
  void EncodePiece(const std::string& piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;  // byte-level (GPT-2 byte-to-unicode) strings
  std::vector<int32_t> token_types_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  // Key: left id * vocab + right id; value: merge rank (lower merges first).
  std::unordered_map<int64_t, int32_t> merge_rank_;
  std::unordered_map<int64_t, int32_t> merge_result_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // longest first
  bool special_first_byte_[256] = {};
  int32_t byte_token_[256] = {};
  std::string byte_to_unicode_[256];
  std::unordered_map<uint32_t, uint8_t> unicode_to_byte_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
};

}  // namespace kvc::worker
