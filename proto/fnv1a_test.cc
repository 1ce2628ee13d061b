#include "proto/fnv1a.h"

#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

// Values computed independently (Python) with Strata's offset basis, which
// plan fingerprints, stream keys and store file names already depend on.
TEST(Fnv1a64Test, KeepsTheValuesStrataDependsOn) {
  EXPECT_EQ(Fnv1a64(""), 0x14650fb0739d0383ull);
  EXPECT_EQ(Fnv1a64("a"), 0x44bd8ad473cd9906ull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x88fad7c0a8ff07f2ull);
  EXPECT_EQ(Fnv1a64("layer.w"), 0x2be8011e762ff083ull);
  EXPECT_EQ(Fnv1a64(std::string("\x00\xff", 2)), 0x9a68e000c5486252ull);
}

TEST(Fnv1a64Test, HashingInPiecesEqualsHashingTheWhole) {
  const std::string text = "strata.synthetic.features";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    uint64_t h = Fnv1a64Update(kFnv1a64Offset, text.data(), cut);
    h = Fnv1a64Update(h, text.data() + cut, text.size() - cut);
    EXPECT_EQ(h, Fnv1a64(text)) << "cut at " << cut;
  }
}

}  // namespace
}  // namespace strata
