#include "runtime/trace.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

TEST(TracerTest, NamesWithQuotesBackslashesAndControlCharactersParseBack) {
  const std::string name = "send \"x\\y\"\n\t\x01 to rank 1";
  Tracer tracer(1);
  tracer.Add(name, "comm", 10, 25, 7, 4096);
  tracer.Add("fwd", "action", 30, 20);  // ends before it starts: duration 0
  const std::string path = TempPath("escaped.trace.json");
  ASSERT_TRUE(tracer.Write(path).ok());
  const nlohmann::json trace = ReadJson(path);
  const nlohmann::json& events = trace.at("traceEvents");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["ph"], "M");
  EXPECT_EQ(events[0]["args"]["name"], "rank 1");
  EXPECT_EQ(events[1]["name"], name);
  EXPECT_EQ(events[1]["cat"], "comm");
  EXPECT_EQ(events[1]["tid"], 1);
  EXPECT_EQ(events[1]["ts"], 10);
  EXPECT_EQ(events[1]["dur"], 15);
  EXPECT_EQ(events[1]["args"]["cpu_us"], 7);
  EXPECT_EQ(events[1]["args"]["bytes"], 4096);
  EXPECT_EQ(events[2]["dur"], 0);
  EXPECT_FALSE(events[2].contains("args"));
}

TEST(TracerTest, MergedPartsHoldEveryRanksEvents) {
  std::vector<std::string> parts;
  for (int rank = 0; rank < 2; ++rank) {
    Tracer tracer(rank);
    tracer.Add(rank == 0 ? "a]\"[" : "b", "op", 1, 2);
    parts.push_back(TempPath("merge.trace.json.rank" + std::to_string(rank)));
    ASSERT_TRUE(tracer.Write(parts.back()).ok());
  }
  const std::string path = TempPath("merge.trace.json");
  ASSERT_TRUE(MergeTraceFiles(parts, path).ok());
  const nlohmann::json merged = ReadJson(path);
  const nlohmann::json& events = merged.at("traceEvents");
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[1]["name"], "a]\"[");
  EXPECT_EQ(events[3]["name"], "b");
  EXPECT_EQ(events[3]["tid"], 1);
}

}  // namespace
}  // namespace strata
