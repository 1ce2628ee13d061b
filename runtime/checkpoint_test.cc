#include "runtime/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) { return absl::StrCat(::testing::TempDir(), "/ckpt_", name); }

template <typename T>
Tensor MakeTensor(Shape shape, std::vector<T> values) {
  Tensor t = Tensor::Empty(DataTypeOf<T>::value, shape);
  EXPECT_EQ(static_cast<size_t>(t.num_elements()), values.size());
  for (size_t i = 0; i < values.size(); ++i) t.data<T>()[i] = values[i];
  return t;
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
      {"trailing comma", SafetensorsBytes("{\"a\":{\"dtype\":\"F32\",}}", ""), "expected a string key"},
      {"missing colon", SafetensorsBytes("{\"a\" 1}", ""), "expected ':'"},
      {"mismatched bracket", SafetensorsBytes("{]", ""), "expected a string key"},
      {"unterminated string", SafetensorsBytes("{\"abc", ""), "unterminated string"},
      {"text after JSON", SafetensorsBytes(good + " x", eight), "unexpected text after"},
      {"deep nesting", SafetensorsBytes(deep, ""), "nested too deeply"},
      {"bad escape", SafetensorsBytes("{\"a\\q\":1}", ""), "unknown escape"},
      {"lone surrogate", SafetensorsBytes("{\"\\udc00\":1}", ""), "lone low surrogate"},
      {"half surrogate pair", SafetensorsBytes("{\"\\ud800x\":1}", ""), "high surrogate"},
      {"control character", SafetensorsBytes("{\"a\nb\":1}", ""), "control character"},
      {"invalid UTF-8", SafetensorsBytes("{\"\xff\":1}", ""), "not valid UTF-8"},
      {"bad number", SafetensorsBytes("{\"a\":-}", ""), "malformed number"},
      {"bad literal", SafetensorsBytes("{\"a\":nul}", ""), "unexpected character"},
      {"duplicate tensor", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[1]", "[0,4]") + "," +
                                                Entry("a", "\"F32\"", "[1]", "[4,8]") + "}",
                                            eight),
       "duplicate key \"a\""},
      {"entry not object", SafetensorsBytes("{\"a\":3}", ""), "tensor \"a\": expected an object, got a number"},
      {"unknown dtype", SafetensorsBytes("{" + Entry("a", "\"F16\"", "[2]", "[0,4]") + "}", four),
       "unsupported dtype \"F16\""},
      {"dtype not string", SafetensorsBytes("{" + Entry("a", "1", "[2]", "[0,8]") + "}", eight),
       "\"dtype\" must be a string"},
      {"negative dim", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[-2]", "[0,8]") + "}", eight),
       "non-negative integers"},
      {"fractional dim", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[2.0]", "[0,8]") + "}", eight),
       "non-negative integers"},
      {"huge dim", SafetensorsBytes("{" + Entry("a", "\"F32\"", "[99999999999999999999]", "[0,8]") + "}", eight),
       "non-negative integers"},
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

}  // namespace
}  // namespace strata
