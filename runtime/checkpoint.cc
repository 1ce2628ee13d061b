#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "proto/utf8.h"
#include "runtime/fault_injection.h"

namespace strata {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; add byte swapping");

// Python's safetensors refuses larger headers too.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr int kMaxJsonDepth = 64;
constexpr char kMetadataKey[] = "__metadata__";

// ---------------------------------------------------------------------------
// dtypes.

const char* SafetensorsDtype(DataType dtype) {
  switch (dtype) {
    case F32: return "F32";
    case F64: return "F64";
    case I64: return "I64";
    case I32: return "I32";
    case BOOL: return "BOOL";
    case BF16: return "BF16";
    case F16: return "F16";
    default: return nullptr;
  }
}

bool ParseSafetensorsDtype(absl::string_view name, DataType* dtype) {
  for (DataType d : {F32, F64, I64, I32, BOOL, BF16, F16}) {
    if (name == SafetensorsDtype(d)) {
      *dtype = d;
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------------------
// The JSON header (nlohmann::json).

using Json = nlohmann::json;

// How a header value is named in messages.
const char* KindName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float: return "a number";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return "no value";
  }
}

// A non-negative integer literal that fits in int64. nlohmann reads "-0" as a
// signed integer, and "2.0", "1e3" and integers past UINT64_MAX as floats:
// all refused, as sizes and offsets.
bool JsonToInt64(const Json& v, int64_t* out) {
  if (!v.is_number_unsigned()) return false;
  const uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(INT64_MAX)) return false;
  *out = static_cast<int64_t>(u);
  return true;
}

// nlohmann's message without its "[json.exception.parse_error.101] parse
// error at line 1, column 6: " prefix, and with a long "last read" token (an
// unterminated string can be the rest of the header) cut short.
std::string JsonErrorText(absl::string_view what) {
  if (const size_t bracket = what.find("] "); bracket != absl::string_view::npos) what.remove_prefix(bracket + 2);
  if (absl::StartsWith(what, "parse error")) {
    if (const size_t colon = what.find(": "); colon != absl::string_view::npos) what.remove_prefix(colon + 2);
  }
  std::string text(what);
  static constexpr char kLastRead[] = "last read: '";
  constexpr size_t kMaxToken = 40;
  const size_t start = text.find(kLastRead);
  if (start == std::string::npos) return text;
  const size_t begin = start + sizeof(kLastRead) - 1;
  size_t end = text.rfind("'; expected ");
  if (end == std::string::npos || end < begin) end = text.rfind('\'');
  if (end == std::string::npos || end < begin || end - begin <= kMaxToken) return text;
  size_t cut = begin + kMaxToken;
  while (cut > begin && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  text.replace(cut, end - cut, "...");
  return text;
}

// Builds the header's JSON from nlohmann's SAX events, refusing beyond JSON's
// grammar what a header may not hold: nesting deeper than kMaxJsonDepth
// (refused as it opens, before a 100 MB "[[[[..." is built) and a key repeated
// in one object (nlohmann's DOM parser would keep the last one silently).
// nlohmann's callback parser could check both, but its end_object rescans the
// parent object: quadratic over a header's tensors (50,000 tensors: 30 s).
class HeaderBuilder : public Json::json_sax_t {
 public:
  bool null() override { return Add(Json(nullptr)); }
  bool boolean(bool value) override { return Add(Json(value)); }
  bool number_integer(Json::number_integer_t value) override { return Add(Json(value)); }
  bool number_unsigned(Json::number_unsigned_t value) override { return Add(Json(value)); }
  bool number_float(Json::number_float_t value, const std::string& /*text*/) override { return Add(Json(value)); }
  bool string(std::string& value) override { return Add(Json(std::move(value))); }
  bool binary(Json::binary_t& /*value*/) override { return Refuse("a binary value"); }  // not in JSON text
  bool start_object(std::size_t /*elements*/) override {
    keys_.emplace_back();
    return Open(Json::object());
  }
  bool key(std::string& key) override {
    if (!keys_.back().insert(key).second) {
      return Refuse(absl::StrCat("duplicate key \"", absl::CHexEscape(key), "\""));
    }
    key_ = std::move(key);
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*elements*/) override { return Open(Json::array()); }
  bool end_array() override {
    open_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/, const Json::exception& e) override {
    // `position` counts from 1; the offset into the header counts from 0.
    error_ = absl::DataLossError(absl::StrCat("bad JSON header at byte ", position > 0 ? position - 1 : 0, ": ",
                                              JsonErrorText(e.what())));
    return false;
  }

  const absl::Status& error() const { return error_; }
  Json& root() { return root_; }

 private:
  bool Refuse(absl::string_view what) {
    error_ = absl::DataLossError(absl::StrCat("bad JSON header: ", what));
    return false;
  }
  // Into the innermost open array or object (under the last key), or as the root.
  Json* Place(Json value) {
    if (open_.empty()) return &(root_ = std::move(value));
    Json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    return &(parent[key_] = std::move(value));
  }
  bool Add(Json value) {
    Place(std::move(value));
    return true;
  }
  bool Open(Json container) {
    if (open_.size() >= kMaxJsonDepth) return Refuse("nested too deeply");
    // Only the innermost open container grows, so the pointers to the outer ones stay valid.
    open_.push_back(Place(std::move(container)));
    return true;
  }

  Json root_;
  std::vector<Json*> open_;
  // The keys of each open object; hash sets, so huge headers do not go quadratic.
  std::vector<absl::flat_hash_set<std::string>> keys_;
  std::string key_;
  absl::Status error_;
};

// The header as JSON, or what is wrong with it.
absl::StatusOr<Json> ParseHeaderJson(const std::string& header) {
  HeaderBuilder builder;
  bool ok = false;
  try {
    ok = Json::sax_parse(header, &builder);
  } catch (const Json::exception& e) {  // not expected: errors reach HeaderBuilder::parse_error
    return absl::DataLossError(absl::StrCat("bad JSON header: ", JsonErrorText(e.what())));
  }
  if (!ok) return builder.error().ok() ? absl::DataLossError("bad JSON header") : builder.error();
  return std::move(builder.root());
}

// ---------------------------------------------------------------------------
// Files.

// Closes on every return path.
struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f != nullptr) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

std::string ErrnoText() { return std::strerror(errno); }

absl::Status WriteAll(std::FILE* f, const void* data, size_t bytes, const std::string& path) {
  if (bytes != 0 && std::fwrite(data, 1, bytes, f) != bytes) {
    return absl::DataLossError(absl::StrCat("cannot write ", path, ": ", ErrnoText()));
  }
  return absl::OkStatus();
}

// mkdir -p.
absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("checkpoint directory is empty");
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    std::string prefix = dir.substr(0, slash);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat("cannot create directory ", prefix, ": ", ErrnoText()));
    }
    if (slash == std::string::npos) break;
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create directory ", dir, ": not a directory"));
  }
  return absl::OkStatus();
}

// The *.safetensors files of `dir` (one per rank that wrote a shard), as
// paths sorted by name; `ec` says why the folder could not be read.
std::vector<std::string> SafetensorsFiles(const std::string& dir, std::error_code* ec) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, *ec)) {
    std::error_code ignored;
    if (entry.is_regular_file(ignored) && absl::EndsWith(entry.path().filename().string(), ".safetensors")) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Makes the entries of `dir` (a rename, a new file) durable.
absl::Status FsyncDir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return absl::DataLossError(absl::StrCat("cannot open ", dir, " to sync it: ", ErrnoText()));
  const int rc = fsync(fd);
  const std::string why = rc != 0 ? ErrnoText() : "";
  close(fd);
  if (rc != 0) return absl::DataLossError(absl::StrCat("cannot sync ", dir, ": ", why));
  return absl::OkStatus();
}

// Writes `contents` to dir/name through a temporary name: written, fsync'd,
// renamed, and the folder fsync'd.
absl::Status WriteFileAtomically(const std::string& dir, const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string tmp = path + ".tmp";
  FilePtr f(std::fopen(tmp.c_str(), "wb"));
  if (f == nullptr) return absl::FailedPreconditionError(absl::StrCat("cannot create ", tmp, ": ", ErrnoText()));
  absl::Status s = WriteAll(f.get(), contents.data(), contents.size(), tmp);
  if (s.ok() && (std::fflush(f.get()) != 0 || fsync(fileno(f.get())) != 0)) {
    s = absl::DataLossError(absl::StrCat("cannot write ", tmp, ": ", ErrnoText()));
  }
  if (std::fclose(f.release()) != 0 && s.ok()) s = absl::DataLossError(absl::StrCat("cannot write ", tmp, ": ", ErrnoText()));
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::DataLossError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ErrnoText()));
  }
  if (!s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  return FsyncDir(dir);
}

// ordered_json keeps the layout of Strata's headers: "__metadata__" first,
// then the tensors in name order (their data's order), each as {"dtype",
// "shape", "data_offsets"}. Its own inserts search the members linearly (a
// 10,000-tensor header took 1.1 s), so objects are built from vectors of
// members, whose keys are unique here by construction.
using OrderedJson = nlohmann::ordered_json;
using OrderedMembers = std::vector<std::pair<const std::string, OrderedJson>>;

OrderedJson ObjectOf(OrderedMembers members) {
  return OrderedJson(OrderedJson::object_t(std::make_move_iterator(members.begin()),
                                           std::make_move_iterator(members.end())));
}

absl::StatusOr<std::string> BuildHeader(const Checkpoint& ckpt, uint64_t* data_bytes) {
  OrderedMembers members;
  members.reserve(ckpt.tensors.size() + 1);
  if (!ckpt.metadata.empty()) {
    OrderedMembers metadata;
    for (const auto& [key, value] : ckpt.metadata) {
      if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint metadata \"", absl::CHexEscape(key),
                                                       "\" is not valid UTF-8 (safetensors headers are JSON)"));
      }
      metadata.emplace_back(key, value);
    }
    members.emplace_back(kMetadataKey, ObjectOf(std::move(metadata)));
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : ckpt.tensors) {
    if (name.empty() || name == kMetadataKey || !IsValidUtf8(name)) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint tensor name \"", absl::CHexEscape(name),
                                                     "\" is not allowed (empty, reserved or not UTF-8)"));
    }
    const char* dtype = SafetensorsDtype(tensor.dtype());
    if (!tensor.defined() || dtype == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint tensor \"", name, "\" is ",
                                                     tensor.defined() ? DataTypeName(tensor.dtype()) : "undefined",
                                                     ", expected a defined F32, F64, I64, I32, BOOL, BF16 or F16 tensor"));
    }
    OrderedJson shape = OrderedJson::array();
    for (int d = 0; d < tensor.rank(); ++d) shape.push_back(tensor.dim(d));
    const uint64_t bytes = tensor.bytes();
    members.emplace_back(name, ObjectOf({{"dtype", dtype},
                                         {"shape", std::move(shape)},
                                         {"data_offsets", OrderedJson::array({offset, offset + bytes})}}));
    offset += bytes;
  }
  std::string header;
  try {
    header = ObjectOf(std::move(members)).dump();
  } catch (const OrderedJson::exception& e) {  // not expected: every string was checked to be UTF-8
    return absl::InternalError(absl::StrCat("cannot write the checkpoint header: ", e.what()));
  }
  // Pad with spaces so the data starts 8-byte aligned, as Python's safetensors writes it.
  header.append((8 - header.size() % 8) % 8, ' ');
  *data_bytes = offset;
  return header;
}

absl::Status WriteFileContents(std::FILE* f, const std::string& path, const std::string& header,
                               const Checkpoint& ckpt) {
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  if (absl::Status s = WriteAll(f, length, 8, path); !s.ok()) return s;
  if (absl::Status s = WriteAll(f, header.data(), header.size(), path); !s.ok()) return s;
  for (const auto& [name, tensor] : ckpt.tensors) {
    if (absl::Status s = WriteAll(f, tensor.raw_data(), tensor.bytes(), path); !s.ok()) return s;
  }
  if (std::fflush(f) != 0 || fsync(fileno(f)) != 0) {
    return absl::DataLossError(absl::StrCat("cannot write ", path, ": ", ErrnoText()));
  }
  return absl::OkStatus();
}

// Parsed tensor entry of the header.
struct TensorEntry {
  std::string name;
  DataType dtype = DT_INVALID;
  Shape shape;
  int64_t begin = 0;
  int64_t end = 0;
};

absl::StatusOr<TensorEntry> ParseTensorEntry(const std::string& path, const std::string& name, const Json& value) {
  auto error = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(path, ": tensor \"", absl::CHexEscape(name), "\": ", what));
  };
  if (!value.is_object()) return error(absl::StrCat("expected an object, got ", KindName(value)));
  TensorEntry entry;
  entry.name = name;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (const auto& [key, field] : value.items()) {
    if (key == "dtype") {
      has_dtype = true;
      if (!field.is_string()) return error("\"dtype\" must be a string");
      const std::string& dtype = field.get_ref<const std::string&>();
      if (!ParseSafetensorsDtype(dtype, &entry.dtype)) {
        return error(absl::StrCat("unsupported dtype \"", absl::CHexEscape(dtype),
                                  "\" (expected F32, F64, I64, I32, BOOL, BF16 or F16)"));
      }
    } else if (key == "shape") {
      has_shape = true;
      if (!field.is_array()) return error("\"shape\" must be an array");
      for (const Json& dim : field) {
        int64_t d;
        if (!JsonToInt64(dim, &d)) return error("\"shape\" must hold non-negative integers");
        entry.shape.push_back(d);
      }
    } else if (key == "data_offsets") {
      has_offsets = true;
      if (!field.is_array() || field.size() != 2 || !JsonToInt64(field[0], &entry.begin) ||
          !JsonToInt64(field[1], &entry.end)) {
        return error("\"data_offsets\" must be [begin, end] with non-negative integers");
      }
      if (entry.end < entry.begin) return error(absl::StrCat("data_offsets [", entry.begin, ", ", entry.end,
                                                             "] end before they begin"));
    } else {
      return error(absl::StrCat("unknown field \"", absl::CHexEscape(key), "\""));
    }
  }
  if (!has_dtype || !has_shape || !has_offsets) return error("needs \"dtype\", \"shape\" and \"data_offsets\"");
  // Element count times element size must equal the byte range, without overflow.
  uint64_t bytes = DataTypeSize(entry.dtype);
  const uint64_t range = static_cast<uint64_t>(entry.end - entry.begin);
  bool overflow = false;
  for (int64_t d : entry.shape) {
    if (d != 0 && bytes > UINT64_MAX / static_cast<uint64_t>(d)) overflow = true;
    bytes *= static_cast<uint64_t>(d);
  }
  if (overflow || bytes != range) {
    return error(absl::StrCat(DataTypeName(entry.dtype), ShapeString(entry.shape), " does not match data_offsets [",
                              entry.begin, ", ", entry.end, "] (", range, " bytes)"));
  }
  return entry;
}

}  // namespace

absl::Status WriteSafetensorsFile(const std::string& path, const Checkpoint& ckpt) {
  uint64_t data_bytes = 0;
  absl::StatusOr<std::string> header = BuildHeader(ckpt, &data_bytes);
  if (!header.ok()) return absl::Status(header.status().code(), absl::StrCat(path, ": ", header.status().message()));
  FilePtr f(std::fopen(path.c_str(), "wb"));
  if (f == nullptr) return absl::FailedPreconditionError(absl::StrCat("cannot create ", path, ": ", ErrnoText()));
  absl::Status s = WriteFileContents(f.get(), path, *header, ckpt);
  if (std::fclose(f.release()) != 0 && s.ok()) {
    s = absl::DataLossError(absl::StrCat("cannot write ", path, ": ", ErrnoText()));
  }
  if (!s.ok()) std::remove(path.c_str());
  return s;
}

namespace {

// How much of a file ReadSafetensors reads.
enum class ReadExtent {
  kMetadata,  // the header's metadata alone
  kLayout,    // the header, and that its tensors tile the data section (no data read)
  kAll,
};

// The whole file, or less of it (ReadExtent); with `wanted`, the data of
// only the tensors it names (the others are not read, nor in the result).
absl::StatusOr<Checkpoint> ReadSafetensors(const std::string& path, ReadExtent extent,
                                           const std::function<bool(const std::string&)>* wanted = nullptr) {
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (f == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::FailedPreconditionError(absl::StrCat("cannot open ", path, ": ", ErrnoText()));
  }
  struct stat st;
  if (fstat(fileno(f.get()), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t file_size = st.st_size;
  if (file_size < 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: ", file_size, " bytes, a safetensors file has 8+"));
  }
  uint8_t length_bytes[8];
  if (std::fread(length_bytes, 1, 8, f.get()) != 8) {
    return absl::DataLossError(absl::StrCat(path, ": cannot read the header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | length_bytes[i];
  if (header_len > file_size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len, " exceeds the ", file_size - 8,
                                            " bytes after it (truncated or not a safetensors file)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len, " exceeds the limit of ",
                                            kMaxHeaderBytes));
  }
  std::string header(header_len, '\0');
  if (std::fread(header.data(), 1, header_len, f.get()) != header_len) {
    return absl::DataLossError(absl::StrCat(path, ": cannot read the ", header_len, "-byte header"));
  }
  if (header.empty() || header[0] != '{') {
    return absl::DataLossError(absl::StrCat(path, ": header does not start with '{'"));
  }
  if (!IsValidUtf8(header)) return absl::DataLossError(absl::StrCat(path, ": header is not valid UTF-8"));
  absl::StatusOr<Json> json = ParseHeaderJson(header);
  if (!json.ok()) return absl::DataLossError(absl::StrCat(path, ": ", json.status().message()));

  // Members come in key order (nlohmann::json's objects are sorted maps).
  Checkpoint ckpt;
  std::vector<TensorEntry> entries;
  for (const auto& [name, value] : json->items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) {
        return absl::DataLossError(absl::StrCat(path, ": \"__metadata__\" must be an object of strings"));
      }
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) {
          return absl::DataLossError(absl::StrCat(path, ": metadata \"", absl::CHexEscape(key), "\" is ",
                                                  KindName(item), ", expected a string"));
        }
        ckpt.metadata[key] = item.get<std::string>();
      }
      continue;
    }
    absl::StatusOr<TensorEntry> entry = ParseTensorEntry(path, name, value);
    if (!entry.ok()) return entry.status();
    entries.push_back(*std::move(entry));
  }
  if (extent == ReadExtent::kMetadata) return ckpt;

  // The tensors must tile the data section exactly: no gap, no overlap, nothing after.
  const uint64_t data_size = file_size - 8 - header_len;
  std::vector<const TensorEntry*> by_offset;
  for (const TensorEntry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return std::make_pair(a->begin, a->end) < std::make_pair(b->begin, b->end);
  });
  uint64_t expected_begin = 0;
  for (const TensorEntry* e : by_offset) {
    if (static_cast<uint64_t>(e->begin) != expected_begin) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor \"", absl::CHexEscape(e->name), "\" data_offsets [", e->begin, ", ", e->end, "] ",
          static_cast<uint64_t>(e->begin) < expected_begin ? "overlap" : "leave a gap after", " the previous tensor (",
          "expected to begin at ", expected_begin, ")"));
    }
    if (static_cast<uint64_t>(e->end) > data_size) {
      return absl::DataLossError(absl::StrCat(path, ": tensor \"", absl::CHexEscape(e->name), "\" data_offsets [",
                                              e->begin, ", ", e->end, "] run past the ", data_size,
                                              "-byte data section (truncated file?)"));
    }
    expected_begin = e->end;
  }
  if (expected_begin != data_size) {
    return absl::DataLossError(absl::StrCat(path, ": the tensors cover ", expected_begin, " bytes but the data section has ",
                                            data_size));
  }

  if (extent == ReadExtent::kLayout) {
    for (const TensorEntry& e : entries) ckpt.tensors.emplace(e.name, Tensor());  // names only
    return ckpt;
  }

  // Data in file order: one forward pass through the file, past the
  // tensors not wanted.
  const uint64_t data_begin = 8 + header_len;
  bool skipped = false;
  for (const TensorEntry* e : by_offset) {
    if (wanted != nullptr && !(*wanted)(e->name)) {
      skipped = true;
      continue;
    }
    if (skipped && fseeko(f.get(), static_cast<off_t>(data_begin + e->begin), SEEK_SET) != 0) {
      return absl::DataLossError(absl::StrCat(path, ": cannot seek to the data of tensor \"", e->name, "\""));
    }
    skipped = false;
    Tensor t = Tensor::Empty(e->dtype, e->shape);
    if (!t.defined()) {
      return absl::ResourceExhaustedError(absl::StrCat(path, ": cannot allocate ", DataTypeName(e->dtype),
                                                       ShapeString(e->shape), " for tensor \"", e->name, "\""));
    }
    if (t.bytes() != 0 && std::fread(t.raw_data(), 1, t.bytes(), f.get()) != t.bytes()) {
      return absl::DataLossError(absl::StrCat(path, ": cannot read the data of tensor \"", e->name, "\""));
    }
    if (e->dtype == BOOL) {
      // Bytes other than 0 and 1 are not valid bools in C++.
      const uint8_t* bytes = static_cast<const uint8_t*>(t.raw_data());
      for (size_t i = 0; i < t.bytes(); ++i) {
        if (bytes[i] > 1) {
          return absl::DataLossError(absl::StrCat(path, ": tensor \"", e->name, "\" holds BOOL byte ",
                                                  static_cast<int>(bytes[i]), " at element ", i, ", expected 0 or 1"));
        }
      }
    }
    ckpt.tensors.emplace(e->name, std::move(t));
  }
  return ckpt;
}

}  // namespace

absl::StatusOr<Checkpoint> ReadSafetensorsFile(const std::string& path) { return ReadSafetensors(path, ReadExtent::kAll); }

absl::Status SaveCheckpoint(const std::string& dir, const Checkpoint& ckpt) {
  return SaveCheckpointShard(dir, kCheckpointFileName, ckpt);
}

absl::Status SaveCheckpointShard(const std::string& dir, const std::string& file_name, const Checkpoint& ckpt) {
  if (absl::Status s = MakeDirs(dir); !s.ok()) return s;
  const std::string path = absl::StrCat(dir, "/", file_name);
  const std::string tmp = path + ".tmp";
  if (absl::Status s = WriteSafetensorsFile(tmp, ckpt); !s.ok()) return s;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = absl::DataLossError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ErrnoText()));
    std::remove(tmp.c_str());
    return s;
  }
  // Make the rename itself durable.
  return FsyncDir(dir);
}

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir, const TensorFilter* wanted) {
  std::error_code ec;
  const std::vector<std::string> files = SafetensorsFiles(dir, &ec);
  if (ec) {
    // Only a folder that is not there is "not found"; an unreadable one is an error.
    const std::string why = absl::StrCat(dir, ": cannot read checkpoint folder: ", ec.message());
    return ec == std::errc::no_such_file_or_directory ? absl::NotFoundError(why) : absl::FailedPreconditionError(why);
  }
  if (files.empty()) return absl::DataLossError(absl::StrCat(dir, ": no *.safetensors checkpoint files"));
  // The filter sees every file's metadata (headers only), read first.
  std::map<std::string, std::string> all_metadata;
  std::function<bool(const std::string&)> want;
  if (wanted != nullptr) {
    for (const auto& file : files) {
      auto header = ReadSafetensors(file, ReadExtent::kMetadata);
      if (!header.ok()) return header.status();
      all_metadata.insert(header->metadata.begin(), header->metadata.end());
    }
    want = [&](const std::string& name) { return (*wanted)(name, all_metadata); };
  }
  Checkpoint merged;
  for (const auto& file : files) {
    auto shard = ReadSafetensors(file, ReadExtent::kAll, wanted != nullptr ? &want : nullptr);
    if (!shard.ok()) return shard.status();
    for (auto& [name, tensor] : shard->tensors) {
      auto it = merged.tensors.find(name);
      if (it != merged.tensors.end()) {
        // Replicated state (the step counter) appears in every shard; it must agree.
        if (it->second.bytes() != tensor.bytes() ||
            std::memcmp(it->second.raw_data(), tensor.raw_data(), tensor.bytes()) != 0) {
          return absl::DataLossError(absl::StrCat(file, ": tensor '", name, "' differs from another shard's"));
        }
        continue;
      }
      merged.tensors.emplace(name, std::move(tensor));
    }
    for (auto& [k, v] : shard->metadata) {
      auto it = merged.metadata.find(k);
      if (it != merged.metadata.end() && it->second != v) {
        return absl::DataLossError(absl::StrCat(file, ": metadata '", k, "' is '", v, "' but another shard says '", it->second, "'"));
      }
      merged.metadata[k] = v;
    }
  }
  return merged;
}

// ---------------------------------------------------------------------------
// Step folders.

namespace {

constexpr char kStepPrefix[] = "step-";

std::string RankFileName(int rank) { return absl::StrCat("model.rank", rank, ".safetensors"); }

// N of "step-N", or -1.
int64_t StepOfFolderName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kStepPrefix) || name.empty() || name.size() > 18) return -1;
  if (name.find_first_not_of("0123456789") != absl::string_view::npos) return -1;
  int64_t step;
  return absl::SimpleAtoi(name, &step) ? step : -1;
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// "a/./b/" and "a/b" are one folder.
std::filesystem::path NormalFolder(const std::string& p) {
  std::string n = std::filesystem::path(p).lexically_normal().string();
  while (n.size() > 1 && n.back() == '/') n.pop_back();
  return std::filesystem::path(n);
}

// The step folders of `dir` by step.
std::map<int64_t, std::string> StepFolders(const std::string& dir) {
  std::map<int64_t, std::string> folders;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const int64_t step = StepOfFolderName(name);
    if (step >= 0 && entry.is_directory(ec)) folders[step] = entry.path().string();
  }
  return folders;
}

// The folder name DIR/latest holds ("step-N"), or "" when there is no latest.
absl::StatusOr<std::string> ReadLatest(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kLatestFileName);
  if (!IsRegularFile(path)) {
    std::error_code ec;
    if (const std::filesystem::file_status link = std::filesystem::symlink_status(path, ec);
        std::filesystem::exists(link)) {
      // A save would fail at its end (renaming onto it), a load find no step.
      const bool dangling = std::filesystem::is_symlink(link) && !std::filesystem::exists(path, ec);
      return absl::FailedPreconditionError(absl::StrCat(path, dangling ? ": a link to nothing" : ": not a file",
                                                        "; a checkpoint's 'latest' is a file naming its newest step "
                                                        "folder"));
    }
    return std::string();
  }
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (f == nullptr) return absl::FailedPreconditionError(absl::StrCat("cannot open ", path, ": ", ErrnoText()));
  char buf[64];
  const size_t n = std::fread(buf, 1, sizeof(buf), f.get());
  const std::string name(absl::StripAsciiWhitespace(absl::string_view(buf, n)));
  if (StepOfFolderName(name) < 0) {
    return absl::DataLossError(absl::StrCat(path, ": expected a step folder name such as step-20, got '",
                                            absl::CHexEscape(name), "'"));
  }
  return name;
}

// Rank 0, once the save is committed: committed step folders beyond the
// newest `keep` up to this step, and uncommitted ones before it (saves that
// never finished), go. Later steps (another run's) are left alone.
void PruneStepFolders(const std::string& dir, int64_t step, int keep) {
  int kept = 0;
  const std::map<int64_t, std::string> folders = StepFolders(dir);
  for (auto it = folders.rbegin(); it != folders.rend(); ++it) {
    if (it->first > step) continue;
    const bool committed = IsRegularFile(absl::StrCat(it->second, "/", kCommittedFileName));
    if (it->first == step || (committed && (keep == 0 || kept < keep))) {
      kept += committed ? 1 : 0;
      continue;
    }
    std::error_code ec;
    std::filesystem::remove_all(it->second, ec);
  }
}

}  // namespace

absl::Status SaveCheckpointStep(const SaveStepOptions& options, Checkpoint ckpt) {
  if (options.dir.empty() || options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size ||
      options.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint save: bad options (dir '", options.dir, "', rank ",
                                                   options.rank, " of ", options.world_size, ", step ", options.step, ")"));
  }
  const std::string folder = absl::StrCat(options.dir, "/", kStepPrefix, options.step);
  ckpt.metadata["format_version"] = absl::StrCat(kCheckpointFormatVersion);
  ckpt.metadata["world_size"] = absl::StrCat(options.world_size);
  ckpt.metadata["step"] = absl::StrCat(options.step);
  absl::Status mine = [&]() -> absl::Status {
    absl::StatusOr<std::string> latest = ReadLatest(options.dir);
    if (!latest.ok()) return latest.status();
    if (*latest == absl::StrCat(kStepPrefix, options.step)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--save ", options.dir, ": ", folder, " is the latest checkpoint; refusing to overwrite it in place"));
    }
    if (absl::Status s = MakeDirs(folder); !s.ok()) return s;
    // The folder is being rewritten: not committed until every rank agrees
    // again (every rank, before it replaces its share), ...
    std::remove(absl::StrCat(folder, "/", kCommittedFileName).c_str());
    if (options.rank == 0) {
      // ... and no file of a larger world left in it.
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
        const std::string filename = entry.path().filename().string();
        absl::string_view name = filename;
        int64_t r;
        if (absl::ConsumePrefix(&name, "model.rank") && absl::ConsumeSuffix(&name, ".safetensors") &&
            absl::SimpleAtoi(name, &r) && r >= options.world_size) {
          std::filesystem::remove(entry.path(), ec);
        }
      }
    }
    const std::string file = RankFileName(options.rank);
    if (FaultRequested("checkpoint_partial_write", options.rank, options.step)) {
      // Half of the file where the whole would go, then gone.
      const std::string path = absl::StrCat(folder, "/", file, ".tmp");
      if (WriteSafetensorsFile(path, ckpt).ok()) {
        struct stat st;
        if (stat(path.c_str(), &st) == 0 && truncate(path.c_str(), st.st_size / 2) != 0) std::remove(path.c_str());
      }
      InjectedFault("checkpoint_partial_write", options.rank);
    }
    if (absl::Status s = SaveCheckpointShard(folder, file, ckpt); !s.ok()) return s;
    if (FaultRequested("checkpoint_before_agree", options.rank, options.step)) {
      InjectedFault("checkpoint_before_agree", options.rank);
    }
    return absl::OkStatus();
  }();
  absl::Status all = options.agree ? options.agree(mine) : mine;
  if (!mine.ok()) return mine;
  if (!all.ok()) {
    return absl::Status(all.code(), absl::StrCat("checkpoint ", folder, " not saved (", options.dir,
                                                 "/latest unchanged): ", all.message()));
  }
  if (options.rank != 0) return absl::OkStatus();
  // Every rank said its file is durable; on a folder every rank shares, rank
  // 0 sees them all.
  for (int r = 0; r < options.world_size; ++r) {
    if (!IsRegularFile(absl::StrCat(folder, "/", RankFileName(r)))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", folder, " not committed: rank ", r, "'s ", RankFileName(r),
          " is not there although rank ", r, " wrote it; --save must be a folder every rank shares"));
    }
  }
  // The step, and an id of this save that nothing else shares: ranks that
  // resume compare it (two runs' step folders of one step are told apart).
  std::random_device entropy;
  const uint64_t id = (uint64_t{entropy()} << 32) ^ entropy() ^ static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  if (absl::Status s = WriteFileAtomically(folder, kCommittedFileName,
                                           absl::StrCat(options.step, "\nsave ", absl::Hex(id, absl::kZeroPad16), "\n"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteFileAtomically(options.dir, kLatestFileName, absl::StrCat(kStepPrefix, options.step, "\n"));
      !s.ok()) {
    return s;
  }
  PruneStepFolders(options.dir, options.step, options.keep);
  return absl::OkStatus();
}

absl::Status CheckSaveTarget(const std::string& dir, bool resumes_from_it) {
  if (absl::Status s = MakeDirs(dir); !s.ok()) return absl::Status(s.code(), absl::StrCat("--save ", dir, ": ", s.message()));
  const std::string probe = absl::StrCat(dir, "/.strata-write-test.", getpid());
  FilePtr f(std::fopen(probe.c_str(), "wb"));
  if (f == nullptr) return absl::FailedPreconditionError(absl::StrCat("--save ", dir, ": cannot write there: ", ErrnoText()));
  f.reset();
  std::remove(probe.c_str());
  absl::StatusOr<std::string> latest = ReadLatest(dir);
  if (!latest.ok())
    return absl::Status(latest.status().code(), absl::StrCat("--save ", dir, ": ", latest.status().message()));
  if (resumes_from_it) return absl::OkStatus();
  if (!latest->empty()) {
    const std::string folder = absl::StrCat(dir, "/", *latest);
    if (!IsRegularFile(absl::StrCat(folder, "/", kCommittedFileName))) {
      return absl::FailedPreconditionError(absl::StrCat("--save ", dir, ": its 'latest' names ", *latest,
                                                        ", which is missing or not committed; save to another folder"));
    }
    return absl::FailedPreconditionError(absl::StrCat("--save ", dir, " already holds a checkpoint (", folder,
                                                      "); resume it with --load ", dir, ", or save to another folder"));
  }
  // Committed saves without 'latest' (a damaged checkpoint) are not
  // overwritten either: a save of the same step would replace one.
  for (const auto& [step, folder] : StepFolders(dir)) {
    if (IsRegularFile(absl::StrCat(folder, "/", kCommittedFileName))) {
      return absl::FailedPreconditionError(
          absl::StrCat("--save ", dir, " holds committed step folders but no 'latest' (", folder,
                       "); resume one with --load ", folder, ", or save to another folder"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> LatestStep(const std::string& dir) {
  absl::StatusOr<std::string> latest = ReadLatest(dir);
  if (!latest.ok()) return latest.status();
  return latest->empty() ? -1 : StepOfFolderName(*latest);
}

bool SameFolder(const std::string& a, const std::string& b) {
  return !a.empty() && !b.empty() && NormalFolder(a) == NormalFolder(b);
}

bool LoadsFromSaveFolder(const std::string& load, const std::string& save) {
  if (load.empty() || save.empty()) return false;
  const std::filesystem::path l = NormalFolder(load), s = NormalFolder(save);
  return l == s || (StepOfFolderName(l.filename().string()) >= 0 && l.parent_path() == s);
}

namespace {

// The "save ID" line of a step folder's COMMITTED file; "" without one.
std::string SaveIdOf(const std::string& folder) {
  std::ifstream in(absl::StrCat(folder, "/", kCommittedFileName));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "save ")) return line.substr(5);
  }
  return "";
}

}  // namespace

absl::StatusOr<CheckpointSource> ResolveCheckpoint(const std::string& path) {
  if (!IsDirectory(path)) {
    return absl::NotFoundError(absl::StrCat(
        path, IsRegularFile(path) ? ": a file, not a checkpoint folder (--load DIR or DIR/step-N)" : ": no such checkpoint folder"));
  }
  absl::StatusOr<std::string> latest = ReadLatest(path);
  if (!latest.ok()) return latest.status();
  if (!latest->empty()) {
    const std::string folder = absl::StrCat(path, "/", *latest);
    if (!IsRegularFile(absl::StrCat(folder, "/", kCommittedFileName))) {
      return absl::DataLossError(absl::StrCat(path, "/latest names ", *latest, ", which is missing or not committed"));
    }
    return CheckpointSource{folder, absl::StrCat(folder, " (latest)"), SaveIdOf(folder)};
  }
  std::error_code ec;
  const bool has_files = !SafetensorsFiles(path, &ec).empty();
  if (ec) return absl::FailedPreconditionError(absl::StrCat(path, ": cannot read checkpoint folder: ", ec.message()));
  if (has_files) return CheckpointSource{path, path, SaveIdOf(path)};
  // NotFound only when nothing was ever completed here (a restarted job may
  // then start afresh); committed step folders without `latest` are a
  // damaged checkpoint, not an empty one.
  const std::map<int64_t, std::string> step_folders = StepFolders(path);
  for (const auto& [step, folder] : step_folders) {
    if (IsRegularFile(absl::StrCat(folder, "/", kCommittedFileName))) {
      return absl::DataLossError(absl::StrCat(path, ": has committed step folders but no 'latest'; give one as --load ",
                                              folder));
    }
  }
  if (!step_folders.empty()) {
    return absl::NotFoundError(absl::StrCat(path, ": no completed save (only unfinished step folders)"));
  }
  return absl::NotFoundError(absl::StrCat(path, ": no checkpoint (neither 'latest' nor *.safetensors files)"));
}

absl::StatusOr<std::map<std::string, std::string>> ReadCheckpointMetadata(const std::string& path) {
  absl::StatusOr<CheckpointSource> resolved = ResolveCheckpoint(path);
  if (!resolved.ok()) return resolved.status();
  std::error_code ec;
  const std::vector<std::string> files = SafetensorsFiles(resolved->folder, &ec);
  if (files.empty()) return absl::NotFoundError(absl::StrCat(resolved->folder, ": no *.safetensors checkpoint files"));
  absl::StatusOr<Checkpoint> header = ReadSafetensors(files[0], ReadExtent::kMetadata);
  if (!header.ok()) return header.status();
  return header->metadata;
}

absl::StatusOr<std::set<std::string>> CheckCheckpointFiles(const std::string& path) {
  absl::StatusOr<CheckpointSource> resolved = ResolveCheckpoint(path);
  if (!resolved.ok()) return resolved.status();
  std::set<std::string> names;
  std::error_code ec;
  for (const std::string& file : SafetensorsFiles(resolved->folder, &ec)) {
    absl::StatusOr<Checkpoint> layout = ReadSafetensors(file, ReadExtent::kLayout);
    if (!layout.ok()) return layout.status();
    for (const auto& [name, unused] : layout->tensors) names.insert(name);
  }
  return names;
}

absl::StatusOr<Checkpoint> LoadCheckpointFrom(const std::string& path, CheckpointSource* source,
                                              const TensorFilter* wanted) {
  absl::StatusOr<CheckpointSource> resolved = ResolveCheckpoint(path);
  if (!resolved.ok()) return resolved.status();
  if (source != nullptr) *source = *resolved;
  const std::string& folder = resolved->folder;
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(folder, wanted);
  if (!ckpt.ok()) return ckpt.status();
  auto version = ckpt->metadata.find("format_version");
  if (version == ckpt->metadata.end()) return ckpt;  // format 1: flat files, as written before step folders
  int64_t v = 0, world = 0;
  if (!absl::SimpleAtoi(version->second, &v) || v < 1) {
    return absl::DataLossError(absl::StrCat(folder, ": bad checkpoint format_version '", version->second, "'"));
  }
  if (v > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(folder, ": checkpoint format ", version->second,
                                                      " is newer than this strata reads (", kCheckpointFormatVersion, ")"));
  }
  if (!IsRegularFile(absl::StrCat(folder, "/", kCommittedFileName))) {
    // The parent as the user spelled it, less a trailing slash.
    std::string trimmed = folder;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    const std::filesystem::path path(trimmed);
    // A step folder's save folder holds the complete ones; elsewhere there is no other to name.
    std::string hint;
    if (StepOfFolderName(path.filename().string()) >= 0) {
      hint = absl::StrCat("; --load ", path.has_parent_path() ? path.parent_path().string() : ".",
                          " takes the latest complete one");
    }
    return absl::DataLossError(absl::StrCat(folder, ": not committed (a save that did not finish)", hint));
  }
  auto w = ckpt->metadata.find("world_size");
  if (w == ckpt->metadata.end() || !absl::SimpleAtoi(w->second, &world) || world < 1) {
    return absl::DataLossError(absl::StrCat(folder, ": checkpoint metadata has no valid world_size"));
  }
  std::set<std::string> files, expected;
  for (int r = 0; r < world; ++r) expected.insert(RankFileName(r));
  std::error_code ec;
  for (const std::string& path : SafetensorsFiles(folder, &ec)) {
    files.insert(std::filesystem::path(path).filename().string());
  }
  if (files != expected) {
    return absl::DataLossError(absl::StrCat(folder, ": holds ", files.size(), " rank file(s) but was saved by ", world,
                                            " rank(s) (expected ", RankFileName(0), " .. ", RankFileName(world - 1), ")"));
  }
  return ckpt;
}

}  // namespace strata
