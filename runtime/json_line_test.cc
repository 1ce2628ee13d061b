#include "runtime/json_line.h"

#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

using OrderedJson = nlohmann::ordered_json;

TEST(JsonLineTest, WritesOneLineWithPythonsSeparatorsInInsertionOrder) {
  OrderedJson value = {{"step", 3}, {"epoch", 1}, {"loss", 2.5}, {"args", {{"b", 1}, {"a", OrderedJson::array({1, 2})}}}};
  EXPECT_EQ(JsonLine(value), R"({"step": 3, "epoch": 1, "loss": 2.5, "args": {"b": 1, "a": [1, 2]}})");
  EXPECT_EQ(JsonLine(OrderedJson::object()), "{}");
  EXPECT_EQ(JsonLine(OrderedJson::array()), "[]");
}

TEST(JsonLineTest, EscapedNamesParseBackToTheSameString) {
  const std::string name = "a\"b\\c\nd\te\x01 f/\xC3\xBC";
  const std::string line = JsonLine(OrderedJson{{name, name}});
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  const nlohmann::json parsed = nlohmann::json::parse(line);
  ASSERT_TRUE(parsed.contains(name)) << line;
  EXPECT_EQ(parsed[name], name);
}

TEST(JsonLineTest, NonFiniteNumbersAreNullAndBadUtf8IsReplaced) {
  OrderedJson value = {{"nan", std::nan("")}, {"inf", std::numeric_limits<double>::infinity()}, {"s", "x\xff"}};
  EXPECT_EQ(JsonLine(value), "{\"nan\": null, \"inf\": null, \"s\": \"x\xEF\xBF\xBD\"}");
}

}  // namespace
}  // namespace strata
