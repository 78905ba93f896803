#include "worker/engine/pretokenizer.h"

#include <cstdint>

#include "worker/engine/unicode.h"

namespace kvc::worker {
namespace {

enum class Cls { kLetter, kNumber, kSpace, kOther };

Cls Classify(uint32_t cp) {
  if (IsLetter(cp)) return Cls::kLetter;
  if (IsNumber(cp)) return Cls::kNumber;
  if (IsWhitespace(cp)) return Cls::kSpace;
  return Cls::kOther;
}

// Applies the GPT-2 regex to cps[begin, end) and appends the piece boundaries (end offsets).
void SplitGpt2(const std::vector<uint32_t>& cps, const std::vector<Cls>& cls, size_t begin,
               size_t end, std::vector<size_t>& cuts) {
  auto cls_at = [&](size_t i) { return i < end ? cls[i] : Cls::kSpace; };
  size_t pos = begin;
  while (pos < end) {
    const uint32_t c = cps[pos];
    // Contractions: 's 't 'm 'd 're 've 'll (case-sensitive, as in the regex).
    if (c == '\'' && pos + 1 < end) {
      const uint32_t n1 = cps[pos + 1];
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        pos += 2;
        cuts.push_back(pos);
        continue;
      }
      if (pos + 2 < end) {
        const uint32_t n2 = cps[pos + 2];
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          pos += 3;
          cuts.push_back(pos);
          continue;
        }
      }
    }
    // ' ?' only ever takes a literal U+0020 in front of a letter/number/other run.
    const bool lead_space = c == ' ' && pos + 1 < end;
    const Cls run_cls = lead_space ? cls_at(pos + 1) : cls[pos];
    if (run_cls != Cls::kSpace) {
      size_t i = pos + (lead_space ? 1 : 0);
      while (i < end && cls[i] == run_cls) ++i;
      pos = i;
      cuts.push_back(pos);
      continue;
    }
    // Whitespace run: \s+(?!\S) leaves the last space for the next word when one follows.
    size_t i = pos;
    while (i < end && cls[i] == Cls::kSpace) ++i;
    if (i < end && i - pos > 1) --i;
    pos = i;
    cuts.push_back(pos);
  }
}

}  // namespace

std::vector<std::string> PreTokenize(absl::string_view text) {
  const std::vector<uint32_t> cps = DecodeUtf8(text);
  std::vector<Cls> cls(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = Classify(cps[i]);

  // Stage 1: isolate each \p{N} code point; stage 2: the GPT-2 regex inside each fragment.
  std::vector<size_t> cuts;
  size_t frag = 0;
  for (size_t i = 0; i <= cps.size(); ++i) {
    if (i == cps.size() || cls[i] == Cls::kNumber) {
      SplitGpt2(cps, cls, frag, i, cuts);
      if (i < cps.size()) cuts.push_back(i + 1);
      frag = i + 1;
    }
  }

  std::vector<std::string> out;
  out.reserve(cuts.size());
  size_t start = 0;
  for (size_t cut : cuts) {
    std::string piece;
    for (size_t i = start; i < cut; ++i) AppendUtf8(cps[i], piece);
    out.push_back(std::move(piece));
    start = cut;
  }
  return out;
}

}  // namespace kvc::worker
