// The GPT-2/SmolLM pre-tokenizer split rules, case by case (regex semantics written out).
#include "worker/engine/pretokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvc::worker {
namespace {

using Pieces = std::vector<std::string>;

TEST(PreTokenizerTest, WordsKeepTheirLeadingSpace) {
  EXPECT_EQ(PreTokenize("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(PreTokenize("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(PreTokenize("end  "), (Pieces{"end", "  "}));
}

TEST(PreTokenizerTest, DigitsAreIsolated) {
  EXPECT_EQ(PreTokenize("abc 123"), (Pieces{"abc", " ", "1", "2", "3"}));
  EXPECT_EQ(PreTokenize("x1y"), (Pieces{"x", "1", "y"}));
}

TEST(PreTokenizerTest, ContractionsAndPunctuation) {
  EXPECT_EQ(PreTokenize("I'm sure they'll"), (Pieces{"I", "'m", " sure", " they", "'ll"}));
  EXPECT_EQ(PreTokenize("Don'T"), (Pieces{"Don", "'", "T"}));  // case-sensitive: 'T is no 't
  EXPECT_EQ(PreTokenize("a->b;"), (Pieces{"a", "->", "b", ";"}));
  EXPECT_EQ(PreTokenize("Hi !?"), (Pieces{"Hi", " !?"}));
}

TEST(PreTokenizerTest, NewlinesBeforeAWordStaySeparate) {
  EXPECT_EQ(PreTokenize("\n\nHello"), (Pieces{"\n", "\n", "Hello"}));
  EXPECT_EQ(PreTokenize("a \n b"), (Pieces{"a", " \n", " b"}));
}

TEST(PreTokenizerTest, UnicodeLettersAndNumbers) {
  EXPECT_EQ(PreTokenize("café naïve"), (Pieces{"café", " naïve"}));
  EXPECT_EQ(PreTokenize("½²"), (Pieces{"½", "²"}));  // \p{N} includes No
}

TEST(PreTokenizerTest, ConcatenationIsLossless) {
  const std::string text = "  Mixed: 12 apples, 'quoted' \t\ttabs\n\n and ünïcödé!  ";
  std::string joined;
  for (const auto& p : PreTokenize(text)) joined += p;
  EXPECT_EQ(joined, text);
}

}  // namespace
}  // namespace kvc::worker
