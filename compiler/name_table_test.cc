#include "compiler/name_table.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(NameTableTest, NumbersNamesInFirstSeenOrder) {
  NameTable t;
  EXPECT_EQ(t.Intern("w"), std::make_pair(0, true));
  EXPECT_EQ(t.Intern("x@grad"), std::make_pair(1, true));
  EXPECT_EQ(t.Intern("w"), std::make_pair(0, false));
  EXPECT_EQ(t.Intern(""), std::make_pair(2, true));
  EXPECT_EQ(t.size(), 3);
  EXPECT_EQ(t.Find("x@grad"), 1);
  EXPECT_EQ(t.Find("x"), -1);
  EXPECT_EQ(t.Find(""), 2);
  EXPECT_EQ(t.name(1), "x@grad");
}

TEST(NameTableTest, CopiesAreIndependentAndOutliveTheOriginal) {
  auto original = std::make_unique<NameTable>();
  for (int i = 0; i < 3000; ++i) original->Intern("block" + std::to_string(i) + ".w");
  NameTable copy = *original;
  EXPECT_EQ(copy.Intern("extra"), std::make_pair(3000, true));
  EXPECT_EQ(original->Find("extra"), -1);
  original.reset();  // the copy's set must not read the original's names
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(copy.Find("block" + std::to_string(i) + ".w"), i);
  EXPECT_EQ(copy.Find("extra"), 3000);
  NameTable assigned;
  assigned.Intern("gone");
  assigned = copy;
  EXPECT_EQ(assigned.Find("gone"), -1);
  EXPECT_EQ(assigned.Find("block42.w"), 42);
}

}  // namespace
}  // namespace strata
