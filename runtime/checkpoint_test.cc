#include "runtime/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) { return absl::StrCat(::testing::TempDir(), "/ckpt_", name); }

template <typename T>
Tensor MakeTensor(Shape shape, std::vector<T> values) {
  Tensor t = Tensor::Empty(DataTypeOf<T>::value, shape);
  EXPECT_EQ(static_cast<size_t>(t.num_elements()), values.size());
  for (size_t i = 0; i < values.size(); ++i) t.data<T>()[i] = values[i];
  return t;
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.num_elements());
}

Tensor MakeBool(Shape shape, std::vector<int> values) {
  Tensor t = Tensor::Empty(BOOL, shape);
  for (size_t i = 0; i < values.size(); ++i) t.data<bool>()[i] = values[i] != 0;
  return t;
}

void ExpectSameTensor(const Tensor& a, const Tensor& b, const std::string& name) {
  ASSERT_TRUE(b.defined()) << name;
  EXPECT_EQ(a.dtype(), b.dtype()) << name;
  EXPECT_EQ(a.shape(), b.shape()) << name;
  ASSERT_EQ(a.bytes(), b.bytes()) << name;
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.bytes()), 0) << name;
}

std::string ReadFile(const std::string& path) {
  std::string bytes;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return bytes;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, n);
  std::fclose(f);
  return bytes;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

std::string LengthPrefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A safetensors file from a header text and data bytes.
std::string SafetensorsBytes(const std::string& header, const std::string& data) {
  return LengthPrefix(header.size()) + header + data;
}

Checkpoint AllDtypesCheckpoint() {
  Checkpoint ckpt;
  ckpt.tensors["fc1.w"] = MakeTensor<float>({2, 3}, {1.5f, -2.25f, 3e-8f, 1e30f, -0.0f, 7.0f});
  ckpt.tensors["fc1.b"] = MakeTensor<double>({3}, {0.1, -1e-300, 12345.678901234567});
  ckpt.tensors["lr"] = MakeTensor<double>({}, {0.05});
  ckpt.tensors["step"] = MakeTensor<int64_t>({}, {-9007199254740993LL});
  ckpt.tensors["ids"] = MakeTensor<int64_t>({4}, {0, 1, INT64_MAX, INT64_MIN});
  ckpt.tensors["counts"] = MakeTensor<int32_t>({2, 2}, {1, -2, INT32_MAX, INT32_MIN});
  ckpt.tensors["mask"] = MakeBool({3}, {1, 0, 1});
  ckpt.tensors["empty"] = Tensor::Empty(F32, {0, 5});
  ckpt.tensors["adam.m/fc1.w \"quoted\" \\ ü\n"] = MakeTensor<float>({1}, {42.0f});
  ckpt.metadata["step"] = "1200";
  ckpt.metadata["program_fingerprint"] = "9f2c\"\\/\t\x01 ✓";
  return ckpt;
}

TEST(CheckpointTest, RoundTripsAllDtypesScalarsEmptyTensorsAndEscapedNames) {
  const std::string dir = TempDir("roundtrip");
  Checkpoint ckpt = AllDtypesCheckpoint();
  ASSERT_TRUE(SaveCheckpoint(dir, ckpt).ok());
  struct stat st;
  EXPECT_NE(stat((dir + "/model.safetensors.tmp").c_str(), &st), 0) << "temporary file left behind";
  absl::StatusOr<Checkpoint> loaded = LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->metadata, ckpt.metadata);
  ASSERT_EQ(loaded->tensors.size(), ckpt.tensors.size());
  for (const auto& [name, tensor] : ckpt.tensors) ExpectSameTensor(tensor, loaded->tensors[name], name);
  EXPECT_EQ(loaded->tensors["lr"].rank(), 0);
  EXPECT_THAT(loaded->tensors["empty"].shape(), ::testing::ElementsAre(0, 5));
}

TEST(CheckpointTest, RoundTripsEmptyCheckpoint) {
  const std::string dir = TempDir("empty");
  ASSERT_TRUE(SaveCheckpoint(dir, Checkpoint()).ok());
  // "{}" padded with spaces to 8 bytes.
  EXPECT_EQ(ReadFile(dir + "/model.safetensors"), LengthPrefix(8) + "{}      ");
  absl::StatusOr<Checkpoint> loaded = LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->tensors.empty());
  EXPECT_TRUE(loaded->metadata.empty());
}

TEST(CheckpointTest, WritesTheSafetensorsHeaderFormat) {
  Checkpoint ckpt;
  ckpt.tensors["b"] = MakeTensor<int64_t>({}, {258});
  ckpt.tensors["a"] = MakeTensor<float>({2}, {1.0f, -2.0f});
  ckpt.metadata["step"] = "7";
  const std::string dir = TempDir("format");
  ASSERT_TRUE(SaveCheckpoint(dir, ckpt).ok());
  std::string bytes = ReadFile(dir + "/model.safetensors");
  // Tensors back to back in name order; the header padded to a multiple of 8.
  std::string header =
      "{\"__metadata__\":{\"step\":\"7\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  ASSERT_EQ(header.size() % 8, 0u);
  const std::string data = std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8) +  // 1.0f, -2.0f little-endian
                           std::string("\x02\x01\x00\x00\x00\x00\x00\x00", 8);   // 258
  EXPECT_EQ(bytes, LengthPrefix(header.size()) + header + data);
}

TEST(CheckpointTest, ReadsHeadersWrittenByOtherWriters) {
  // Whitespace, escapes, surrogate pairs, metadata last, tensors out of offset order.
  const std::string header =
      "{\n  \"w\\/\\ud83d\\ude00\" : { \"shape\" : [ 1 ], \"data_offsets\" : [ 4 , 8 ], \"dtype\" : \"I32\" },\n"
      "  \"v\": {\"dtype\": \"I32\", \"shape\": [], \"data_offsets\": [0, 4]},\n"
      "  \"__metadata__\": {\"format\": \"pt\", \"note\": \"a\\u00e9\\n\"}\n}  ";
  std::string path = TempDir("foreign.safetensors");
  WriteFile(path, SafetensorsBytes(header, std::string("\x05\0\0\0\x06\0\0\0", 8)));
  absl::StatusOr<Checkpoint> ckpt = ReadSafetensorsFile(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ(ckpt->tensors.count("w/\xF0\x9F\x98\x80"), 1u);
  EXPECT_EQ(ckpt->tensors["w/\xF0\x9F\x98\x80"].data<int32_t>()[0], 6);
  EXPECT_EQ(ckpt->tensors["v"].data<int32_t>()[0], 5);
  EXPECT_EQ(ckpt->metadata["format"], "pt");
  EXPECT_EQ(ckpt->metadata["note"], "a\xC3\xA9\n");
}

TEST(CheckpointTest, SaveCreatesParentsAndReplacesAnOldCheckpoint) {
  const std::string dir = TempDir("nested") + "/run1/step_100";
  Checkpoint first;
  first.tensors["w"] = MakeTensor<float>({1}, {1.0f});
  ASSERT_TRUE(SaveCheckpoint(dir, first).ok());
  Checkpoint second;
  second.tensors["w"] = MakeTensor<float>({2}, {2.0f, 3.0f});
  second.metadata["step"] = "200";
  ASSERT_TRUE(SaveCheckpoint(dir, second).ok());
  absl::StatusOr<Checkpoint> loaded = LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameTensor(second.tensors["w"], loaded->tensors["w"], "w");
  EXPECT_EQ(loaded->metadata["step"], "200");
}

TEST(CheckpointTest, MissingCheckpointIsNotFound) {
  absl::StatusOr<Checkpoint> loaded = LoadCheckpoint(TempDir("nowhere"));
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(loaded.status().message(), HasSubstr(TempDir("nowhere")));
}

TEST(CheckpointTest, LoadMergesTheShardsOfSeveralRanks) {
  const std::string dir = TempDir("shards");
  Checkpoint a, b;
  a.tensors["w0"] = Tensor::Zeros(F32, {2});
  a.tensors["@step"] = Tensor::Zeros(I64, {});
  a.metadata["step"] = "3";
  b.tensors["w1"] = Tensor::Zeros(F64, {3});
  b.tensors["@step"] = Tensor::Zeros(I64, {});
  b.metadata["step"] = "3";
  ASSERT_TRUE(SaveCheckpointShard(dir, "model.rank0.safetensors", a).ok());
  ASSERT_TRUE(SaveCheckpointShard(dir, "model.rank1.safetensors", b).ok());
  absl::StatusOr<Checkpoint> merged = LoadCheckpoint(dir);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->tensors.size(), 3u);
  EXPECT_EQ(merged->metadata.at("step"), "3");

  // Shards that disagree on replicated state are refused.
  b.tensors["@step"].Fill(1);
  ASSERT_TRUE(SaveCheckpointShard(dir, "model.rank1.safetensors", b).ok());
  merged = LoadCheckpoint(dir);
  ASSERT_FALSE(merged.ok());
  EXPECT_THAT(merged.status().message(), HasSubstr("'@step' differs"));
}

// With a filter, a load reads only the tensors it names, skipping the
// others' bytes wherever they sit in a file, and the filter sees the
// metadata of every shard (a rank finds the saved parts of what it takes
// there).
TEST(CheckpointTest, LoadReadsOnlyTheWantedTensors) {
  const std::string dir = TempDir("filtered");
  Checkpoint a, b;
  a.tensors["a0"] = MakeTensor<float>({2}, {1, 2});
  a.tensors["b1"] = MakeTensor<double>({3}, {3, 4, 5});  // between two wanted ones in file order
  a.tensors["c2"] = MakeTensor<float>({1}, {6});
  a.metadata["step"] = "3";
  b.tensors["d3"] = MakeTensor<int64_t>({2}, {7, 8});
  b.metadata["step"] = "3";
  b.metadata["part:d3"] = "c2";
  ASSERT_TRUE(SaveCheckpointShard(dir, "model.rank0.safetensors", a).ok());
  ASSERT_TRUE(SaveCheckpointShard(dir, "model.rank1.safetensors", b).ok());
  std::vector<std::string> seen_metadata;
  const TensorFilter wanted = [&](const std::string& name, const std::map<std::string, std::string>& metadata) {
    if (name == "d3") seen_metadata.push_back(metadata.count("part:d3") ? metadata.at("part:d3") : "");
    return name == "a0" || name == "c2" || (metadata.count("part:" + name) && metadata.at("part:" + name) == "c2");
  };
  absl::StatusOr<Checkpoint> loaded = LoadCheckpoint(dir, &wanted);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->tensors.size(), 3u);
  EXPECT_EQ(loaded->tensors.count("b1"), 0u);
  EXPECT_THAT(Values<float>(loaded->tensors.at("a0")), ElementsAre(1, 2));
  EXPECT_THAT(Values<float>(loaded->tensors.at("c2")), ElementsAre(6));
  EXPECT_THAT(Values<int64_t>(loaded->tensors.at("d3")), ElementsAre(7, 8));
  EXPECT_THAT(seen_metadata, ElementsAre("c2"));
  EXPECT_EQ(loaded->metadata.at("part:d3"), "c2");
}

TEST(CheckpointTest, SaveRejectsUnwritableTensorsAndNames) {
  Checkpoint undefined;
  undefined.tensors["w"] = Tensor();
  absl::Status s = SaveCheckpoint(TempDir("bad1"), undefined);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("\"w\" is undefined"));
  for (const std::string& name : {std::string(""), std::string("__metadata__"), std::string("bad\xff")}) {
    Checkpoint ckpt;
    ckpt.tensors[name] = MakeTensor<float>({1}, {1.0f});
    s = SaveCheckpoint(TempDir("bad2"), ckpt);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(s.message(), HasSubstr("is not allowed")) << name;
  }
  Checkpoint bad_metadata;
  bad_metadata.metadata["k"] = "\xc0\x80";  // overlong encoding
  EXPECT_EQ(SaveCheckpoint(TempDir("bad3"), bad_metadata).code(), absl::StatusCode::kInvalidArgument);
  // A directory path that runs through a file cannot be created.
  WriteFile(TempDir("plainfile"), "x");
  s = SaveCheckpoint(TempDir("plainfile") + "/sub", Checkpoint());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("cannot create directory"));
}

struct CorruptCase {
  std::string label;
  std::string bytes;
  std::string expected;
};

std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return absl::StrCat("\"", name, "\":{\"dtype\":", dtype, ",\"shape\":", shape, ",\"data_offsets\":", offsets, "}");
}

TEST(CheckpointTest, CorruptFilesAreClearErrors) {
  const std::string four(4, '\x01'), eight(8, '\x01');
  const std::string good = "{" + Entry("a", "\"F32\"", "[2]", "[0,8]") + "}";
  std::string deep = "{\"a\":";
  for (int i = 0; i < 5000; ++i) deep += "[";
  std::vector<CorruptCase> cases = {
      {"empty file", "", "truncated: 0 bytes"},
      {"short length", std::string("\x08\x00\x00", 3), "truncated: 3 bytes"},
      {"header length too big", LengthPrefix(uint64_t{1} << 60) + "{}", "header length 1152921504606846976 exceeds"},
      {"header length past end", LengthPrefix(100) + "{}", "header length 100 exceeds the 2 bytes"},
      {"truncated data", SafetensorsBytes(good, four), "run past the 4-byte data section"},
      {"trailing data", SafetensorsBytes(good, eight + "xx"), "cover 8 bytes but the data section has 10"},
      {"not an object", SafetensorsBytes("[]", ""), "does not start with '{'"},
      {"empty header", SafetensorsBytes("", ""), "does not start with '{'"},
      {"unterminated object", SafetensorsBytes("{\"a\":", ""), "unexpected end"},
      {"trailing comma", SafetensorsBytes("{\"a\":{\"dtype\":\"F32\",}}", ""), "unexpected '}'; expected string literal"},
      {"missing colon", SafetensorsBytes("{\"a\" 1}", ""), "expected ':'"},
      {"mismatched bracket", SafetensorsBytes("{]", ""), "unexpected ']'; expected string literal"},
      {"unterminated string", SafetensorsBytes("{\"abc", ""), "missing closing quote"},
      {"text after JSON", SafetensorsBytes(good + " x", eight), "expected end of input"},
      {"deep nesting", SafetensorsBytes(deep, ""), "nested too deeply"},
      {"bad escape", SafetensorsBytes("{\"a\\q\":1}", ""), "forbidden character after backslash"},
      {"lone surrogate", SafetensorsBytes("{\"\\udc00\":1}", ""), "U+DC00..U+DFFF must follow U+D800..U+DBFF"},
      {"half surrogate pair", SafetensorsBytes("{\"\\ud800x\":1}", ""), "U+D800..U+DBFF must be followed by U+DC00..U+DFFF"},
      {"control character", SafetensorsBytes("{\"a\nb\":1}", ""), "control character"},
      {"invalid UTF-8", SafetensorsBytes("{\"\xff\":1}", ""), "not valid UTF-8"},
      {"bad number", SafetensorsBytes("{\"a\":-}", ""), "invalid number"},
      {"bad literal", SafetensorsBytes("{\"a\":nul}", ""), "invalid literal"},
      {"duplicate tensor", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[1]", "[0,4]") + "," +
                                                Entry("a", "\"F32\"", "[1]", "[4,8]") + "}",
                                            eight),
       "duplicate key \"a\""},
      {"duplicate metadata key", SafetensorsBytes("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", ""),
       "duplicate key \"k\""},
      {"not JSON at all", SafetensorsBytes("{this is not JSON}", ""), "bad JSON header at byte 2: syntax error"},
      {"number past double", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[1e999]", "[0,8]") + "}", eight),
       "number overflow"},
      {"entry not object", SafetensorsBytes("{\"a\":3}", ""), "tensor \"a\": expected an object, got a number"},
      {"unknown dtype", SafetensorsBytes("{" + Entry("a", "\"F8_E4M3\"", "[2]", "[0,4]") + "}", four),
       "unsupported dtype \"F8_E4M3\""},
      {"dtype not string", SafetensorsBytes("{" + Entry("a", "1", "[2]", "[0,8]") + "}", eight),
       "\"dtype\" must be a string"},
      {"negative dim", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[-2]", "[0,8]") + "}", eight),
       "non-negative integers"},
      {"fractional dim", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[2.0]", "[0,8]") + "}", eight),
       "non-negative integers"},
      {"huge dim", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[99999999999999999999]", "[0,8]") + "}", eight),
       "non-negative integers"},
      {"minus zero dim", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[-0]", "[0,0]") + "}", ""),
       "non-negative integers"},
      {"exponent dim", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[2e0]", "[0,8]") + "}", eight),
       "non-negative integers"},
      {"dim past int64", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[9223372036854775808]", "[0,8]") + "}", eight),
       "non-negative integers"},
      {"shape not array", SafetensorsBytes("{" + Entry("a", "\"F32\"", "{}", "[0,8]") + "}", eight),
       "\"shape\" must be an array"},
      {"string offsets", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[2]", "[\"0\",\"8\"]") + "}", eight),
       "must be [begin, end] with non-negative integers"},
      {"float offsets", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[2]", "[0.0,8]") + "}", eight),
       "must be [begin, end] with non-negative integers"},
      {"negative offset", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[2]", "[-8,0]") + "}", eight),
       "must be [begin, end] with non-negative integers"},
      {"offset past int64", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[2]", "[0,18446744073709551615]") + "}", eight),
       "must be [begin, end] with non-negative integers"},
      {"shape overflow",
       SafetensorsBytes("{" + Entry("a", "\"F32\"", "[4611686018427387904,4611686018427387904,4]", "[0,0]") + "}", ""),
       "does not match data_offsets"},
      {"three offsets", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[2]", "[0,8,8]") + "}", eight),
       "must be [begin, end]"},
      {"end before begin", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[0]", "[8,0]") + "}", eight),
       "end before they begin"},
      {"size mismatch", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[3]", "[0,8]") + "}", eight),
       "F32[3] does not match data_offsets [0, 8]"},
      {"overlap", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[2]", "[0,8]") + "," +
                                       Entry("b", "\"F32\"", "[2]", "[4,12]") + "}",
                                   eight + four),
       "overlap"},
      {"gap", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[1]", "[0,4]") + "," +
                                   Entry("b", "\"F32\"", "[1]", "[8,12]") + "}",
                               eight + four),
       "leave a gap"},
      {"offsets out of range", SafetensorsBytes("{" + Entry("a", "\"I64\"", "[2]", "[0,16]") + "}", eight),
       "run past the 8-byte data section"},
      {"missing field", SafetensorsBytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[]}}", ""), "needs \"dtype\""},
      {"unknown field",
       SafetensorsBytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":1}}", four),
       "unknown field \"x\""},
      {"metadata not object", SafetensorsBytes("{\"__metadata__\":[]}", ""), "must be an object of strings"},
      {"metadata not string", SafetensorsBytes("{\"__metadata__\":{\"step\":3}}", ""),
       "metadata \"step\" is a number, expected a string"},
      {"bool byte", SafetensorsBytes("{" + Entry("m", "\"BOOL\"", "[2]", "[0,2]") + "}", std::string("\x01\x02", 2)),
       "BOOL byte 2 at element 1"},
  };
  for (const CorruptCase& c : cases) {
    std::string path = TempDir("corrupt.safetensors");
    WriteFile(path, c.bytes);
    absl::StatusOr<Checkpoint> ckpt = ReadSafetensorsFile(path);
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kDataLoss) << c.label << ": " << ckpt.status();
    EXPECT_THAT(ckpt.status().message(), HasSubstr(path)) << c.label;
    EXPECT_THAT(ckpt.status().message(), HasSubstr(c.expected)) << c.label;
  }
}

// An unterminated string runs to the end of the header: the message names
// the problem and shows the start of the string, not all of it.
TEST(CheckpointTest, ErrorInALongStringIsShortAndNamesTheProblem) {
  const std::string path = TempDir("long_string.safetensors");
  WriteFile(path, SafetensorsBytes("{\"" + std::string(100000, 'x'), ""));
  absl::StatusOr<Checkpoint> ckpt = ReadSafetensorsFile(path);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(ckpt.status().message(), HasSubstr(path));
  EXPECT_THAT(ckpt.status().message(), HasSubstr("missing closing quote"));
  EXPECT_THAT(ckpt.status().message(), HasSubstr("xxx..."));
  EXPECT_LT(ckpt.status().message().size(), 400u) << ckpt.status();
}

TEST(CheckpointTest, HeaderAboveTheLimitIsRefusedBeforeReading) {
  // A sparse 200 MB file whose header claims 150 MB: refused by the limit, not read.
  std::string path = TempDir("big_header.safetensors");
  WriteFile(path, LengthPrefix(150'000'000) + "{");
  ASSERT_EQ(truncate(path.c_str(), 200'000'000), 0);
  absl::StatusOr<Checkpoint> ckpt = ReadSafetensorsFile(path);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(ckpt.status().message(), HasSubstr("exceeds the limit"));
  std::remove(path.c_str());
}

TEST(CheckpointTest, EveryTruncationAndManyByteFlipsFailCleanly) {
  const std::string dir = TempDir("fuzz_src");
  ASSERT_TRUE(SaveCheckpoint(dir, AllDtypesCheckpoint()).ok());
  const std::string bytes = ReadFile(dir + "/model.safetensors");
  const std::string path = TempDir("fuzz.safetensors");
  for (size_t n = 0; n < bytes.size(); ++n) {
    WriteFile(path, bytes.substr(0, n));
    ASSERT_FALSE(ReadSafetensorsFile(path).ok()) << "truncated to " << n;
  }
  // Random corruptions must give a status (either way), never a crash or hang.
  std::mt19937 rng(12345);
  int failures = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string mutated = bytes;
    int flips = 1 + rng() % 4;
    for (int k = 0; k < flips; ++k) {
      // Mostly inside the length and header, where the parser works.
      size_t limit = (rng() % 4 == 0) ? mutated.size() : std::min<size_t>(mutated.size(), 8 + 600);
      mutated[rng() % limit] = static_cast<char>(rng());
    }
    WriteFile(path, mutated);
    failures += !ReadSafetensorsFile(path).ok();
  }
  EXPECT_GT(failures, 0);
}

// Cross-check with an independent reader: Python's json and numpy decode our file.
TEST(CheckpointTest, PythonJsonAndNumpyReadOurFile) {
  if (access("/usr/bin/python3", X_OK) != 0) FAIL() << "/usr/bin/python3 is not installed (tools/install_deps.sh installs it)";
  Checkpoint ckpt;
  ckpt.tensors["w"] = MakeTensor<float>({2, 2}, {0.5f, -1.25f, 3.0f, 1e-3f});
  ckpt.tensors["b"] = MakeTensor<double>({}, {2.5});
  ckpt.tensors["ids"] = MakeTensor<int64_t>({3}, {7, -8, 1LL << 40});
  ckpt.tensors["n"] = MakeTensor<int32_t>({1}, {-3});
  ckpt.tensors["mask"] = MakeBool({2}, {0, 1});
  ckpt.tensors["z"] = Tensor::Empty(F32, {0});
  ckpt.metadata["step"] = "12";
  const std::string dir = TempDir("python");
  ASSERT_TRUE(SaveCheckpoint(dir, ckpt).ok());
  const std::string script = TempDir("read_safetensors.py");
  WriteFile(script, R"py(
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert raw[8:9] == b"{" and n % 8 == 0
header = json.loads(raw[8:8 + n].decode("utf-8"))
data = raw[8 + n:]
meta = header.pop("__metadata__")
dtypes = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4", "BOOL": "?"}
end = 0
for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
    b, e = info["data_offsets"]
    assert b == end, (name, b, end)
    end = e
    a = np.frombuffer(data[b:e], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    print(name, info["dtype"], list(a.shape), a.ravel().tolist())
assert end == len(data)
print("meta", json.dumps(meta, sort_keys=True))
)py");
  FILE* pipe = popen(absl::StrCat("/usr/bin/python3 ", script, " ", dir, "/model.safetensors 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) output += buf;
  int rc = pclose(pipe);
  if (output.find("No module named 'numpy'") != std::string::npos) FAIL() << "numpy is not installed (tools/install_deps.sh installs python3-numpy)";
  ASSERT_EQ(rc, 0) << output;
  EXPECT_EQ(output,
            "b F64 [] [2.5]\n"
            "ids I64 [3] [7, -8, 1099511627776]\n"
            "mask BOOL [2] [False, True]\n"
            "n I32 [1] [-3]\n"
            "w F32 [2, 2] [0.5, -1.25, 3.0, 0.0010000000474974513]\n"
            "z F32 [0] []\n"
            "meta {\"step\": \"12\"}\n");
}


// ---------------------------------------------------------------------------
// Step folders (format 2): DIR/step-N/model.rank<R>.safetensors, COMMITTED, DIR/latest.

// An empty folder for one test, whatever an earlier run left there.
std::string FreshDir(const std::string& name) {
  const std::string dir = TempDir(name);
  std::filesystem::remove_all(dir);
  return dir;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// The names in `dir`, sorted.
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// One rank's share at a step: its own weight, and the replicated step counter.
Checkpoint StepCheckpoint(int64_t step, const std::string& weight = "w") {
  Checkpoint ckpt;
  ckpt.tensors[weight] = MakeTensor<float>({2}, {static_cast<float>(step), -static_cast<float>(step)});
  ckpt.tensors["@step"] = MakeTensor<int64_t>({}, {step});
  ckpt.metadata["seed"] = "7";
  return ckpt;
}

SaveStepOptions OneRank(const std::string& dir, int64_t step, int keep = 2) {
  SaveStepOptions options;
  options.dir = dir;
  options.step = step;
  options.keep = keep;
  return options;
}

AgreeFn AgreeOk() {
  return [](const absl::Status&) { return absl::OkStatus(); };
}

absl::Status SaveOneRank(const std::string& dir, int64_t step, int keep = 2) {
  return SaveCheckpointStep(OneRank(dir, step, keep), StepCheckpoint(step));
}

// Every rank in turn, the last ones first and rank 0 (which commits) last, each
// with its own weight "w<R>"; the first error, as the job would report it.
absl::Status SaveRanks(const std::string& dir, int64_t step, int world_size, AgreeFn agree, int keep = 2) {
  absl::Status first;
  for (int rank = world_size - 1; rank >= 0; --rank) {
    SaveStepOptions options = OneRank(dir, step, keep);
    options.rank = rank;
    options.world_size = world_size;
    options.agree = agree;
    first.Update(SaveCheckpointStep(options, StepCheckpoint(step, absl::StrCat("w", rank))));
  }
  return first;
}

// The step of the weight "w" (or `weight`) a loaded checkpoint holds.
void ExpectStep(const absl::StatusOr<Checkpoint>& ckpt, int64_t step, const std::string& weight = "w") {
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ(ckpt->tensors.count(weight), 1u) << weight;
  ExpectSameTensor(StepCheckpoint(step, weight).tensors.at(weight), ckpt->tensors.at(weight), weight);
  ASSERT_EQ(ckpt->tensors.count("@step"), 1u);
  EXPECT_EQ(ckpt->tensors.at("@step").data<int64_t>()[0], step);
  EXPECT_EQ(ckpt->metadata.at("step"), absl::StrCat(step));
}

TEST(CheckpointStepTest, OneRankCommitsEachStepAndPointsLatestAtTheNewest) {
  const std::string dir = FreshDir("step_one_rank");
  ASSERT_TRUE(SaveOneRank(dir, 2).ok());
  EXPECT_EQ(ReadFile(dir + "/latest"), "step-2\n");
  ASSERT_TRUE(SaveOneRank(dir, 4).ok());
  EXPECT_EQ(ReadFile(dir + "/latest"), "step-4\n");
  EXPECT_THAT(Entries(dir), ElementsAre("latest", "step-2", "step-4"));
  EXPECT_THAT(Entries(dir + "/step-2"), ElementsAre("COMMITTED", "model.rank0.safetensors"));
  EXPECT_THAT(Entries(dir + "/step-4"), ElementsAre("COMMITTED", "model.rank0.safetensors"));

  CheckpointSource source;
  absl::StatusOr<Checkpoint> latest = LoadCheckpointFrom(dir, &source);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ExpectStep(latest, 4);
  EXPECT_EQ(latest->metadata.at("seed"), "7");
  EXPECT_EQ(source.folder, dir + "/step-4");
  EXPECT_EQ(source.description, dir + "/step-4 (latest)");

  absl::StatusOr<Checkpoint> older = LoadCheckpointFrom(dir + "/step-2", &source);
  ExpectStep(older, 2);
  EXPECT_EQ(source.folder, dir + "/step-2");
}

TEST(CheckpointStepTest, SaveCreatesTheFolderAndItsParents) {
  const std::string dir = FreshDir("step_parents") + "/runs/a";
  ASSERT_TRUE(SaveOneRank(dir, 1).ok());
  ExpectStep(LoadCheckpointFrom(dir), 1);
  EXPECT_FALSE(Exists(dir + "/latest.tmp"));
  EXPECT_FALSE(Exists(dir + "/step-1/COMMITTED.tmp"));
  EXPECT_FALSE(Exists(dir + "/step-1/model.rank0.safetensors.tmp"));
}

TEST(CheckpointStepTest, KeepRetainsOnlyTheNewestCommittedFolders) {
  const std::string dir = FreshDir("step_keep2");
  for (int64_t step = 1; step <= 5; ++step) ASSERT_TRUE(SaveOneRank(dir, step, /*keep=*/2).ok()) << step;
  EXPECT_THAT(Entries(dir), ElementsAre("latest", "step-4", "step-5"));
  ExpectStep(LoadCheckpointFrom(dir), 5);
  ExpectStep(LoadCheckpointFrom(dir + "/step-4"), 4);

  const std::string one = FreshDir("step_keep1");
  for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(SaveOneRank(one, step, /*keep=*/1).ok()) << step;
  EXPECT_THAT(Entries(one), ElementsAre("latest", "step-3"));
}

TEST(CheckpointStepTest, KeepZeroRetainsEveryCommittedFolder) {
  const std::string dir = FreshDir("step_keep0");
  for (int64_t step = 1; step <= 5; ++step) ASSERT_TRUE(SaveOneRank(dir, step, /*keep=*/0).ok()) << step;
  EXPECT_THAT(Entries(dir), ElementsAre("latest", "step-1", "step-2", "step-3", "step-4", "step-5"));
  for (int64_t step = 1; step <= 5; ++step) ExpectStep(LoadCheckpointFrom(absl::StrCat(dir, "/step-", step)), step);
}

TEST(CheckpointStepTest, SaveRemovesUnfinishedOlderFoldersButNotLaterOnes) {
  const std::string dir = FreshDir("step_prune");
  ASSERT_TRUE(SaveOneRank(dir, 2, /*keep=*/0).ok());
  // A save of step 3 that never finished: a file, no COMMITTED.
  std::filesystem::create_directories(dir + "/step-3");
  WriteFile(dir + "/step-3/model.rank0.safetensors", "half");
  // Another run's folders beyond the step saved next: committed or not, they stay.
  ASSERT_TRUE(SaveCheckpointShard(dir + "/step-9", "model.rank0.safetensors", StepCheckpoint(9)).ok());
  WriteFile(dir + "/step-9/COMMITTED", "9\n");
  std::filesystem::create_directories(dir + "/step-10");
  WriteFile(dir + "/step-10/model.rank0.safetensors.tmp", "x");
  // Not step folders at all: never touched.
  std::filesystem::create_directories(dir + "/step-x");
  WriteFile(dir + "/notes.txt", "mine");

  ASSERT_TRUE(SaveOneRank(dir, 4, /*keep=*/0).ok());
  EXPECT_THAT(Entries(dir), ElementsAre("latest", "notes.txt", "step-10", "step-2", "step-4", "step-9", "step-x"));
  EXPECT_TRUE(Exists(dir + "/step-9/COMMITTED"));
  EXPECT_TRUE(Exists(dir + "/step-10/model.rank0.safetensors.tmp"));
  EXPECT_EQ(ReadFile(dir + "/latest"), "step-4\n");
}

TEST(CheckpointStepTest, SeveralRanksInOneThreadMergeIntoOneCheckpoint) {
  const std::string dir = FreshDir("step_two_ranks");
  std::vector<std::pair<int, bool>> agreed;  // (call, mine.ok())
  AgreeFn agree = [&](const absl::Status& mine) {
    agreed.emplace_back(static_cast<int>(agreed.size()), mine.ok());
    return absl::OkStatus();
  };
  // Rank 1 alone: its file is there, nothing committed yet.
  SaveStepOptions rank1 = OneRank(dir, 6);
  rank1.rank = 1;
  rank1.world_size = 2;
  rank1.agree = agree;
  ASSERT_TRUE(SaveCheckpointStep(rank1, StepCheckpoint(6, "w1")).ok());
  EXPECT_THAT(Entries(dir + "/step-6"), ElementsAre("model.rank1.safetensors"));
  EXPECT_FALSE(Exists(dir + "/latest"));
  // Rank 0 commits.
  SaveStepOptions rank0 = rank1;
  rank0.rank = 0;
  ASSERT_TRUE(SaveCheckpointStep(rank0, StepCheckpoint(6, "w0")).ok());
  EXPECT_EQ(agreed.size(), 2u);
  for (const auto& [call, ok] : agreed) EXPECT_TRUE(ok) << call;
  EXPECT_THAT(Entries(dir + "/step-6"), ElementsAre("COMMITTED", "model.rank0.safetensors", "model.rank1.safetensors"));
  EXPECT_EQ(ReadFile(dir + "/latest"), "step-6\n");

  absl::StatusOr<Checkpoint> loaded = LoadCheckpointFrom(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectStep(loaded, 6, "w0");
  ExpectStep(loaded, 6, "w1");
  EXPECT_EQ(loaded->tensors.size(), 3u);  // w0, w1, @step
  EXPECT_EQ(loaded->metadata.at("world_size"), "2");
}

TEST(CheckpointStepTest, FailedAgreementCommitsNothingAndLeavesLatest) {
  const std::string dir = FreshDir("step_agree_fails");
  ASSERT_TRUE(SaveRanks(dir, 3, 2, AgreeOk()).ok());
  AgreeFn refuse = [](const absl::Status&) { return absl::UnavailableError("rank 1: disk full"); };
  // Both ranks hear the failure; neither commits.
  for (int rank : {1, 0}) {
    SaveStepOptions options = OneRank(dir, 5);
    options.rank = rank;
    options.world_size = 2;
    options.agree = refuse;
    absl::Status s = SaveCheckpointStep(options, StepCheckpoint(5, absl::StrCat("w", rank)));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << rank;
    EXPECT_THAT(s.message(), HasSubstr(dir + "/step-5")) << rank;
    EXPECT_THAT(s.message(), HasSubstr("latest unchanged")) << rank;
    EXPECT_THAT(s.message(), HasSubstr("rank 1: disk full")) << rank;
  }
  EXPECT_EQ(ReadFile(dir + "/latest"), "step-3\n");
  EXPECT_FALSE(Exists(dir + "/step-5/COMMITTED"));
  EXPECT_TRUE(Exists(dir + "/step-3/COMMITTED"));

  absl::StatusOr<Checkpoint> unfinished = LoadCheckpointFrom(dir + "/step-5");
  EXPECT_EQ(unfinished.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(unfinished.status().message(), HasSubstr("not committed"));
  EXPECT_THAT(unfinished.status().message(), HasSubstr(dir + "/step-5"));
  // The hint names the folder that holds `latest`.
  EXPECT_THAT(unfinished.status().message(), HasSubstr(absl::StrCat("--load ", dir, " ")));

  CheckpointSource source;
  absl::StatusOr<Checkpoint> previous = LoadCheckpointFrom(dir, &source);
  ExpectStep(previous, 3, "w0");
  ExpectStep(previous, 3, "w1");
  EXPECT_EQ(source.folder, dir + "/step-3");

  // The next good save replaces the unfinished folder's files and commits it.
  ASSERT_TRUE(SaveRanks(dir, 5, 2, AgreeOk()).ok());
  ExpectStep(LoadCheckpointFrom(dir), 5, "w1");
}

TEST(CheckpointStepTest, ARanksOwnFailureIsPassedToTheAgreementAndReturned) {
  const std::string dir = FreshDir("step_own_failure");
  ASSERT_TRUE(SaveOneRank(dir, 3).ok());
  // Rank 1 cannot write: a regular file where its step folder would go. It still
  // takes part in the agreement (the others would wait for it otherwise).
  WriteFile(dir + "/step-8", "not a folder");
  absl::Status passed;
  int calls = 0;
  SaveStepOptions options = OneRank(dir, 8);
  options.rank = 1;
  options.world_size = 2;
  options.agree = [&](const absl::Status& mine) {
    ++calls;
    passed = mine;
    return absl::AbortedError("rank 1 failed");
  };
  absl::Status s = SaveCheckpointStep(options, StepCheckpoint(8));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(passed.ok());
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(dir + "/step-8"));
  EXPECT_EQ(ReadFile(dir + "/latest"), "step-3\n");
}

TEST(CheckpointStepTest, CommittedFolderMissingARankFileIsRefused) {
  const std::string dir = FreshDir("step_missing_rank");
  ASSERT_TRUE(SaveRanks(dir, 4, 3, AgreeOk()).ok());
  ASSERT_TRUE(LoadCheckpointFrom(dir).ok());
  ASSERT_EQ(std::remove((dir + "/step-4/model.rank1.safetensors").c_str()), 0);
  for (const std::string& path : {dir, dir + "/step-4"}) {
    absl::StatusOr<Checkpoint> loaded = LoadCheckpointFrom(path);
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << path;
    EXPECT_THAT(loaded.status().message(), HasSubstr("holds 2 rank file(s) but was saved by 3 rank(s)")) << path;
    EXPECT_THAT(loaded.status().message(), HasSubstr(dir + "/step-4")) << path;
  }
  // A file beyond the world that saved the folder is refused too.
  ASSERT_TRUE(SaveCheckpointShard(dir + "/step-4", "model.rank1.safetensors", [&] {
                Checkpoint c = StepCheckpoint(4, "w1");
                c.metadata["format_version"] = "2";
                c.metadata["world_size"] = "3";
                c.metadata["step"] = "4";
                return c;
              }()).ok());
  ASSERT_TRUE(LoadCheckpointFrom(dir).ok());
  ASSERT_TRUE(SaveCheckpointShard(dir + "/step-4", "model.rank3.safetensors", Checkpoint()).ok());
  absl::StatusOr<Checkpoint> extra = LoadCheckpointFrom(dir);
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(extra.status().message(), HasSubstr("holds 4 rank file(s) but was saved by 3 rank(s)"));
}

// Fails today (see the report): the cleanup in SaveCheckpointStep binds a
// string_view to the temporary entry.path().filename(), reads freed memory and
// never matches, so model.rank2 stays and the load refuses the merged world sizes.
TEST(CheckpointStepTest, ResavingAFolderWithASmallerWorldRemovesTheExtraRankFiles) {
  const std::string dir = FreshDir("step_smaller_world");
  ASSERT_TRUE(SaveOneRank(dir, 1).ok());
  // An unfinished save of step 4 by three ranks.
  ASSERT_FALSE(SaveRanks(dir, 4, 3, [](const absl::Status&) { return absl::AbortedError("rank 2 died"); }).ok());
  EXPECT_THAT(Entries(dir + "/step-4"),
              ElementsAre("model.rank0.safetensors", "model.rank1.safetensors", "model.rank2.safetensors"));
  // The same step again by two ranks.
  ASSERT_TRUE(SaveRanks(dir, 4, 2, AgreeOk()).ok());
  EXPECT_THAT(Entries(dir + "/step-4"), ElementsAre("COMMITTED", "model.rank0.safetensors", "model.rank1.safetensors"));
  absl::StatusOr<Checkpoint> loaded = LoadCheckpointFrom(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectStep(loaded, 4, "w1");
  EXPECT_EQ(loaded->tensors.count("w2"), 0u);
}

TEST(CheckpointStepTest, RefusesToOverwriteTheFolderLatestNames) {
  const std::string dir = FreshDir("step_overwrite");
  ASSERT_TRUE(SaveOneRank(dir, 4).ok());
  int calls = 0;
  SaveStepOptions options = OneRank(dir, 4);
  options.agree = [&](const absl::Status& mine) {
    ++calls;
    return mine;
  };
  Checkpoint other = StepCheckpoint(4);
  other.tensors["w"].Fill(123);
  absl::Status s = SaveCheckpointStep(options, other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("refusing to overwrite"));
  EXPECT_THAT(s.message(), HasSubstr(dir + "/step-4"));
  EXPECT_EQ(calls, 1);  // the refusal still takes part in the agreement
  EXPECT_EQ(ReadFile(dir + "/latest"), "step-4\n");
  EXPECT_TRUE(Exists(dir + "/step-4/COMMITTED"));
  ExpectStep(LoadCheckpointFrom(dir), 4);
}

TEST(CheckpointStepTest, SavedFilesCarryFormatVersionWorldSizeAndStep) {
  const std::string dir = FreshDir("step_file_metadata");
  Checkpoint ckpt = StepCheckpoint(12);
  ckpt.metadata["step"] = "999";  // the folder's step wins
  ckpt.metadata["program"] = "mlp";
  for (int rank : {1, 0}) {
    SaveStepOptions options = OneRank(dir, 12);
    options.rank = rank;
    options.world_size = 2;
    options.agree = AgreeOk();
    ASSERT_TRUE(SaveCheckpointStep(options, ckpt).ok()) << rank;
  }
  for (int rank : {0, 1}) {
    const std::string path = absl::StrCat(dir, "/step-12/model.rank", rank, ".safetensors");
    absl::StatusOr<Checkpoint> file = ReadSafetensorsFile(path);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(file->metadata.at("format_version"), "2") << path;
    EXPECT_EQ(file->metadata.at("format_version"), absl::StrCat(kCheckpointFormatVersion)) << path;
    EXPECT_EQ(file->metadata.at("world_size"), "2") << path;
    EXPECT_EQ(file->metadata.at("step"), "12") << path;
    EXPECT_EQ(file->metadata.at("program"), "mlp") << path;
    EXPECT_EQ(file->metadata.at("seed"), "7") << path;
  }
  // The step, then the save's own id, which ResolveCheckpoint reads back.
  const std::string committed = ReadFile(dir + "/step-12/COMMITTED");
  EXPECT_THAT(committed, ::testing::MatchesRegex("12\nsave [0-9a-f]{16}\n"));
  absl::StatusOr<CheckpointSource> source = ResolveCheckpoint(dir);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(absl::StrCat("12\nsave ", source->save_id, "\n"), committed);
}

TEST(CheckpointStepTest, ReadCheckpointMetadataReadsTheResolvedFolder) {
  const std::string dir = FreshDir("step_read_metadata");
  ASSERT_TRUE(SaveRanks(dir, 2, 2, AgreeOk()).ok());
  ASSERT_TRUE(SaveRanks(dir, 4, 2, AgreeOk()).ok());
  absl::StatusOr<std::map<std::string, std::string>> latest = ReadCheckpointMetadata(dir);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->at("step"), "4");
  EXPECT_EQ(latest->at("world_size"), "2");
  EXPECT_EQ(latest->at("format_version"), "2");
  EXPECT_EQ(latest->at("seed"), "7");
  absl::StatusOr<std::map<std::string, std::string>> older = ReadCheckpointMetadata(dir + "/step-2");
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(older->at("step"), "2");

  // Format 1: the metadata as written.
  const std::string flat = FreshDir("step_read_metadata_flat");
  Checkpoint ckpt;
  ckpt.metadata["step"] = "30";
  ASSERT_TRUE(SaveCheckpoint(flat, ckpt).ok());
  absl::StatusOr<std::map<std::string, std::string>> flat_metadata = ReadCheckpointMetadata(flat);
  ASSERT_TRUE(flat_metadata.ok()) << flat_metadata.status();
  EXPECT_EQ(*flat_metadata, ckpt.metadata);

  EXPECT_EQ(ReadCheckpointMetadata(FreshDir("step_read_metadata_none")).status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointStepTest, ResolveCheckpointExplainsWhatIsMissing) {
  // No folder.
  const std::string missing = FreshDir("resolve_missing");
  absl::StatusOr<CheckpointSource> s = ResolveCheckpoint(missing);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr(missing));
  EXPECT_EQ(LoadCheckpointFrom(missing).status().code(), absl::StatusCode::kNotFound);

  // An empty folder.
  const std::string empty = FreshDir("resolve_empty");
  std::filesystem::create_directories(empty);
  s = ResolveCheckpoint(empty);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr(empty));

  // Step folders but no `latest`: no save finished.
  const std::string unfinished = FreshDir("resolve_no_latest");
  std::filesystem::create_directories(unfinished + "/step-3");
  WriteFile(unfinished + "/step-3/model.rank0.safetensors.tmp", "x");
  s = ResolveCheckpoint(unfinished);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("no completed save"));
  EXPECT_THAT(s.status().message(), HasSubstr(unfinished));

  // `latest` holding garbage, or a name that is no step folder.
  const std::string garbage = FreshDir("resolve_garbage");
  ASSERT_TRUE(SaveOneRank(garbage, 2).ok());
  const std::vector<std::string> garbage_texts = {"../etc", "", "step-", "step-2/..", "step--1", "/etc/passwd",
                                                  std::string(200, 'a')};
  for (const std::string& text : garbage_texts) {
    WriteFile(garbage + "/latest", text);
    s = ResolveCheckpoint(garbage);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << text;
    EXPECT_THAT(s.status().message(), HasSubstr(garbage + "/latest")) << text;
    EXPECT_EQ(LoadCheckpointFrom(garbage).status().code(), absl::StatusCode::kDataLoss) << text;
  }

  // `latest` naming a folder that is gone, or not committed.
  const std::string dangling = FreshDir("resolve_dangling");
  ASSERT_TRUE(SaveOneRank(dangling, 2).ok());
  WriteFile(dangling + "/latest", "step-7\n");
  s = ResolveCheckpoint(dangling);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("step-7"));
  WriteFile(dangling + "/latest", "step-2\n");
  ASSERT_EQ(std::remove((dangling + "/step-2/COMMITTED").c_str()), 0);
  s = ResolveCheckpoint(dangling);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("not committed"));

  // The good cases: DIR, DIR/step-N, and a flat folder.
  const std::string good = FreshDir("resolve_good");
  ASSERT_TRUE(SaveOneRank(good, 5).ok());
  s = ResolveCheckpoint(good);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->folder, good + "/step-5");
  EXPECT_EQ(s->description, good + "/step-5 (latest)");
  s = ResolveCheckpoint(good + "/step-5");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->folder, good + "/step-5");
}

TEST(CheckpointStepTest, FlatFormatOneFoldersStillLoad) {
  const std::string dir = FreshDir("step_format1");
  Checkpoint ckpt = AllDtypesCheckpoint();
  ASSERT_TRUE(SaveCheckpoint(dir, ckpt).ok());
  CheckpointSource source;
  absl::StatusOr<Checkpoint> loaded = LoadCheckpointFrom(dir, &source);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(source.folder, dir);
  EXPECT_EQ(loaded->metadata, ckpt.metadata);
  ASSERT_EQ(loaded->tensors.size(), ckpt.tensors.size());
  for (const auto& [name, tensor] : ckpt.tensors) ExpectSameTensor(tensor, loaded->tensors[name], name);

  // Format-1 shards of several ranks, no COMMITTED: merged as before.
  const std::string shards = FreshDir("step_format1_shards");
  ASSERT_TRUE(SaveCheckpointShard(shards, "model.rank0.safetensors", StepCheckpoint(3, "w0")).ok());
  ASSERT_TRUE(SaveCheckpointShard(shards, "model.rank1.safetensors", StepCheckpoint(3, "w1")).ok());
  absl::StatusOr<Checkpoint> merged = LoadCheckpointFrom(shards);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->tensors.size(), 3u);
}

TEST(CheckpointStepTest, LoadRefusesAFormatNewerThanItReads) {
  const std::string dir = FreshDir("step_format3");
  Checkpoint ckpt = StepCheckpoint(1);
  ckpt.metadata["format_version"] = absl::StrCat(kCheckpointFormatVersion + 1);
  ckpt.metadata["world_size"] = "1";
  ASSERT_TRUE(SaveCheckpointShard(dir + "/step-1", "model.rank0.safetensors", ckpt).ok());
  WriteFile(dir + "/step-1/COMMITTED", "1\n");
  WriteFile(dir + "/latest", "step-1\n");
  absl::StatusOr<Checkpoint> loaded = LoadCheckpointFrom(dir);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.status().message(), HasSubstr("checkpoint format 3"));
}

TEST(CheckpointStepTest, CheckSaveTargetCreatesAFreshFolderAndRefusesAnotherRunsCheckpoint) {
  const std::string fresh = FreshDir("target_fresh") + "/a/b";
  ASSERT_TRUE(CheckSaveTarget(fresh, /*resumes_from_it=*/false).ok());
  EXPECT_TRUE(std::filesystem::is_directory(fresh));
  EXPECT_THAT(Entries(fresh), ElementsAre()) << "the write probe is left behind";
  // Unfinished step folders are no other run's checkpoint.
  std::filesystem::create_directories(fresh + "/step-3");
  EXPECT_TRUE(CheckSaveTarget(fresh, false).ok());

  const std::string used = FreshDir("target_used");
  ASSERT_TRUE(SaveOneRank(used, 2).ok());
  absl::Status s = CheckSaveTarget(used, /*resumes_from_it=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("already holds a checkpoint"));
  EXPECT_THAT(s.message(), HasSubstr(used + "/step-2"));
  EXPECT_TRUE(CheckSaveTarget(used, /*resumes_from_it=*/true).ok());

  // A `latest` that is not a step folder name is an error either way.
  WriteFile(used + "/latest", "../etc");
  EXPECT_EQ(CheckSaveTarget(used, true).code(), absl::StatusCode::kDataLoss);

  // One naming a step folder that is not there: no advice to resume it.
  WriteFile(used + "/latest", "step-5\n");
  s = CheckSaveTarget(used, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "--save " + used +
                             ": its 'latest' names step-5, which is missing or not committed; save to "
                             "another folder");

  // Committed step folders without `latest` (a damaged checkpoint): a save
  // of the same step would overwrite one, so it is refused too.
  std::filesystem::remove(used + "/latest");
  s = CheckSaveTarget(used, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "--save " + used + " holds committed step folders but no 'latest' (" + used +
                             "/step-2); resume one with --load " + used + "/step-2, or save to another folder");

  // A `latest` that is a folder: refused before training, where the save's
  // rename onto it would fail at the end.
  std::filesystem::create_directories(used + "/latest");
  s = CheckSaveTarget(used, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--save " + used + ": " + used + "/latest: not a file"));
  EXPECT_EQ(ResolveCheckpoint(used).status().code(), absl::StatusCode::kFailedPrecondition);

  // A folder under a regular file cannot be created.
  const std::string file = FreshDir("target_file");
  WriteFile(file, "x");
  s = CheckSaveTarget(file + "/ckpt", false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--save " + file + "/ckpt"));
  s = CheckSaveTarget(file, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("not a directory"));
}

TEST(CheckpointStepTest, LoadsFromSaveFolderMatchesTheFolderAndItsStepFolders) {
  EXPECT_TRUE(LoadsFromSaveFolder("ckpt", "ckpt"));
  EXPECT_TRUE(LoadsFromSaveFolder("ckpt/", "ckpt"));
  EXPECT_TRUE(LoadsFromSaveFolder("ckpt", "ckpt/"));
  EXPECT_TRUE(LoadsFromSaveFolder("./ckpt", "ckpt"));
  EXPECT_TRUE(LoadsFromSaveFolder("runs/../ckpt", "ckpt"));
  EXPECT_TRUE(LoadsFromSaveFolder("ckpt/step-4", "ckpt"));
  EXPECT_TRUE(LoadsFromSaveFolder("ckpt//step-4", "ckpt/"));
  EXPECT_TRUE(LoadsFromSaveFolder("ckpt/step-4/", "ckpt"));  // a shell completes the slash
  EXPECT_FALSE(LoadsFromSaveFolder("", "ckpt"));
  EXPECT_FALSE(LoadsFromSaveFolder("ckpt", ""));
  EXPECT_FALSE(LoadsFromSaveFolder("other", "ckpt"));
  EXPECT_FALSE(LoadsFromSaveFolder("ckpt2", "ckpt"));
  EXPECT_FALSE(LoadsFromSaveFolder("ckpt/step-x", "ckpt"));
  EXPECT_FALSE(LoadsFromSaveFolder("ckpt/sub/step-4", "ckpt"));
  EXPECT_FALSE(LoadsFromSaveFolder("other/step-4", "ckpt"));
}

// STRATA_FAULT ends the process part-way through a save; the previous step stays the latest.
class CheckpointFaultTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CheckpointFaultTest, PartialWriteExitsAndLeavesThePreviousStepLatest) {
  const std::string dir = FreshDir("fault_partial");
  ASSERT_TRUE(SaveOneRank(dir, 2).ok());
  EXPECT_EXIT(
      {
        setenv("STRATA_FAULT", "checkpoint_partial_write", 1);
        (void)SaveOneRank(dir, 4);
      },
      ::testing::ExitedWithCode(kFaultExitCode), "rank 0: fault injected at checkpoint_partial_write");
  EXPECT_THAT(Entries(dir + "/step-4"), ElementsAre("model.rank0.safetensors.tmp"));
  EXPECT_EQ(ReadFile(dir + "/latest"), "step-2\n");
  ExpectStep(LoadCheckpointFrom(dir), 2);
  EXPECT_EQ(LoadCheckpointFrom(dir + "/step-4").status().code(), absl::StatusCode::kNotFound);
  // The next save succeeds and removes the unfinished folder.
  ASSERT_TRUE(SaveOneRank(dir, 6).ok());
  EXPECT_THAT(Entries(dir), ElementsAre("latest", "step-2", "step-6"));
}

TEST_F(CheckpointFaultTest, FaultBeforeAgreeLeavesADurableFileButNoCommit) {
  const std::string dir = FreshDir("fault_before_agree");
  ASSERT_TRUE(SaveRanks(dir, 2, 2, AgreeOk()).ok());
  EXPECT_EXIT(
      {
        setenv("STRATA_FAULT", "checkpoint_before_agree:rank=1:step=4", 1);
        (void)SaveRanks(dir, 4, 2, AgreeOk());
      },
      ::testing::ExitedWithCode(kFaultExitCode), "rank 1: fault injected at checkpoint_before_agree");
  EXPECT_THAT(Entries(dir + "/step-4"), ElementsAre("model.rank1.safetensors"));
  EXPECT_TRUE(ReadSafetensorsFile(dir + "/step-4/model.rank1.safetensors").ok());
  EXPECT_EQ(ReadFile(dir + "/latest"), "step-2\n");
  absl::StatusOr<Checkpoint> unfinished = LoadCheckpointFrom(dir + "/step-4");
  EXPECT_EQ(unfinished.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(unfinished.status().message(), HasSubstr("not committed"));
}

TEST_F(CheckpointFaultTest, FaultFiresOnlyForTheNamedRankAndStep) {
  const std::string dir = FreshDir("fault_filters");
  EXPECT_EXIT(
      {
        // Other ranks, other steps and other points save normally; then the named one exits.
        setenv("STRATA_FAULT", "checkpoint_partial_write:rank=0:step=3", 1);
        if (!SaveRanks(dir, 2, 2, AgreeOk()).ok()) std::_Exit(1);  // step 2: no fault
        SaveStepOptions rank1 = OneRank(dir, 3);
        rank1.rank = 1;
        rank1.world_size = 2;
        rank1.agree = AgreeOk();
        if (!SaveCheckpointStep(rank1, StepCheckpoint(3, "w1")).ok()) std::_Exit(2);  // rank 1: no fault
        setenv("STRATA_FAULT", "checkpoint_before_agree_typo", 1);
        SaveStepOptions rank0 = rank1;
        rank0.rank = 0;
        if (!SaveCheckpointStep(rank0, StepCheckpoint(3, "w0")).ok()) std::_Exit(3);  // unknown point: no fault
        setenv("STRATA_FAULT", "checkpoint_partial_write:rank=0:step=5", 1);
        if (!SaveRanks(dir, 5, 2, AgreeOk()).ok()) std::_Exit(4);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kFaultExitCode), "rank 0: fault injected at checkpoint_partial_write");
  EXPECT_EQ(ReadFile(dir + "/latest"), "step-3\n");
  EXPECT_THAT(Entries(dir + "/step-5"), ElementsAre("model.rank0.safetensors.tmp", "model.rank1.safetensors"));
}

// Found while writing these tests (see the report): cases the code gets wrong.

// A folder `latest` does not name may still hold a COMMITTED from an earlier
// attempt (a crash between COMMITTED and the rename of `latest`). When a later
// run saves that step again, a rank other than 0 replaces its file while the
// folder still reads as committed, so a crash before rank 0 gets there leaves a
// "committed" folder mixing two saves.
TEST(CheckpointStepTest, ReplacingAShareUncommitsTheFolderFirst) {
  const std::string dir = FreshDir("step_stale_commit");
  ASSERT_TRUE(SaveRanks(dir, 2, 2, AgreeOk()).ok());
  // step-4 committed by an attempt that died before replacing `latest`.
  ASSERT_TRUE(SaveRanks(dir, 4, 2, AgreeOk(), /*keep=*/0).ok());
  WriteFile(dir + "/latest", "step-2\n");
  // The resumed run saves step 4 again; rank 1 gets there first.
  SaveStepOptions rank1 = OneRank(dir, 4);
  rank1.rank = 1;
  rank1.world_size = 2;
  rank1.agree = AgreeOk();
  Checkpoint changed = StepCheckpoint(4, "w1");
  changed.tensors["w1"].Fill(99);
  ASSERT_TRUE(SaveCheckpointStep(rank1, changed).ok());
  EXPECT_FALSE(Exists(dir + "/step-4/COMMITTED"))
      << "step-4 reads as committed while holding rank 1's new file and rank 0's old one";
}

// `--load ckpt/step-7/` (a shell completes the slash) gets a hint naming the
// step folder itself instead of the folder holding `latest`.
TEST(CheckpointStepTest, NotCommittedHintNamesTheParentGivenATrailingSlash) {
  const std::string dir = FreshDir("step_trailing_slash");
  ASSERT_TRUE(SaveOneRank(dir, 2).ok());
  ASSERT_FALSE(SaveRanks(dir, 7, 1, [](const absl::Status&) { return absl::AbortedError("no"); }).ok());
  absl::StatusOr<Checkpoint> loaded = LoadCheckpointFrom(dir + "/step-7/");
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(), HasSubstr("not committed"));
  EXPECT_THAT(loaded.status().message(), HasSubstr(absl::StrCat("--load ", dir, " ")));
}

}  // namespace
}  // namespace strata
