// Unicode category tables for the byte-level BPE pre-tokenizer (generated data, see
// scripts/worker/gen_unicode_tables.py). Plain C++; no dependencies.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvc::worker::unicode_internal {

struct CodePointRange {
  uint32_t first;
  uint32_t last;  // inclusive
};

extern const CodePointRange kLetterRanges[];
extern const size_t kLetterRangesSize;
extern const CodePointRange kNumberRanges[];
extern const size_t kNumberRangesSize;
extern const CodePointRange kSpaceRanges[];
extern const size_t kSpaceRangesSize;

}  // namespace kvc::worker::unicode_internal
