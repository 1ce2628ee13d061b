#include "proto/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(Utf8Test, AcceptsWellFormedText) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("layer.w"));
  EXPECT_TRUE(IsValidUtf8(std::string("nul\0inside", 10)));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9"));          // U+00E9
  EXPECT_TRUE(IsValidUtf8("\xe2\x82\xac"));      // U+20AC
  EXPECT_TRUE(IsValidUtf8("\xf0\x9f\x98\x80"));  // U+1F600
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));  // U+10FFFF, the last code point
  EXPECT_TRUE(IsValidUtf8("\xed\x9f\xbf"));      // U+D7FF, just below the surrogates
}

TEST(Utf8Test, RejectsBadLeadAndContinuationBytes) {
  EXPECT_FALSE(IsValidUtf8("bad\xff"));
  EXPECT_FALSE(IsValidUtf8("\x80"));              // a continuation byte alone
  EXPECT_FALSE(IsValidUtf8("\xf8\x88\x80\x80\x80"));  // five-byte form
  EXPECT_FALSE(IsValidUtf8("\xc3\x28"));          // lead not followed by a continuation
  EXPECT_FALSE(IsValidUtf8("\xe2\x82\x28"));
}

TEST(Utf8Test, RejectsTruncatedCharacters) {
  EXPECT_FALSE(IsValidUtf8("\xc3"));
  EXPECT_FALSE(IsValidUtf8("a\xe2\x82"));
  EXPECT_FALSE(IsValidUtf8("\xf0\x9f\x98"));
}

TEST(Utf8Test, RejectsOverlongSurrogatesAndValuesPastU10FFFF) {
  EXPECT_FALSE(IsValidUtf8("\xc0\x80"));          // overlong U+0000
  EXPECT_FALSE(IsValidUtf8("\xc1\xbf"));          // overlong U+007F
  EXPECT_FALSE(IsValidUtf8("\xe0\x9f\xbf"));      // overlong U+07FF
  EXPECT_FALSE(IsValidUtf8("\xf0\x8f\xbf\xbf"));  // overlong U+FFFF
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // U+D800
  EXPECT_FALSE(IsValidUtf8("\xed\xbf\xbf"));      // U+DFFF
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // U+110000
}

}  // namespace
}  // namespace strata
