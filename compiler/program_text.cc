#include "compiler/program_text.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "proto/utf8.h"

namespace strata {
namespace {

// Programs, strategies and plans are text; far beyond this is not one of them.
constexpr size_t kMaxTextFileBytes = size_t{256} << 20;

class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (has_error_) return;
    has_error_ = true;
    line_ = line;
    column_ = column;
    message_ = std::string(absl::StripSuffix(message, "."));  // it goes inside parentheses after an unclosed '{'
    // protobuf names the token it found; at the end of the input that is
    // nothing, which reads as a cut-off message.
    if (absl::EndsWith(message, "got: ")) absl::StrAppend(&message_, "the end of the file");
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
  bool has_error() const { return has_error_; }
  int line() const { return line_; }  // from 0, as protobuf counts
  int column() const { return column_; }
  const std::string& message() const { return message_; }

 private:
  bool has_error_ = false;
  int line_ = 0, column_ = 0;
  std::string message_;
};

// Where a '{' opened that no '}' closes, from 0 as protobuf counts.
struct TextPosition {
  int line = 0, column = 0;
  bool operator<(const TextPosition& o) const { return line != o.line ? line < o.line : column < o.column; }
};

// The '{'s of `text` never closed, outermost first; braces in strings and
// comments do not count. Columns advance to the next multiple of 8 at a tab, as
// protobuf's tokenizer counts them.
std::vector<TextPosition> UnclosedBraces(const std::string& text) {
  std::vector<TextPosition> open;
  TextPosition at;
  char quote = 0;  // inside a string: its quote character
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      quote = 0;  // strings and comments end at the line
      comment = false;
      ++at.line;
      at.column = 0;
      continue;
    }
    if (comment) continue;
    if (quote != 0) {
      if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\n') {
        ++i;
        ++at.column;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == '#') {
      comment = true;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '{') {
      open.push_back(at);
    } else if (c == '}' && !open.empty()) {
      open.pop_back();
    }
    at.column = c == '\t' ? at.column + 8 - at.column % 8 : at.column + 1;
  }
  return open;
}

// After an unclosed '{' the parser gives up a line or more later, on the
// next field that the open message lacks (a var left open meets `op`): name
// the last '{' never closed that opened before that point, then the parser's
// own words.
std::string ParseError(const std::string& text, const std::string& filename, const FirstErrorCollector& errors) {
  const std::string parser = absl::StrCat(errors.line() + 1, ":", errors.column() + 1, ": ", errors.message());
  const TextPosition stopped{errors.line(), errors.column()};
  const std::vector<TextPosition> open = UnclosedBraces(text);
  for (auto it = open.rbegin(); it != open.rend(); ++it) {
    if (!(*it < stopped)) continue;
    return absl::StrCat(filename, ":", it->line + 1, ":", it->column + 1,
                        ": '{' opened here is never closed (the parser stopped at ", parser, ")");
  }
  return absl::StrCat(filename, ":", parser);
}

// Text files only: a NUL byte or mostly non-text bytes means a binary file.
absl::Status CheckLooksLikeText(const std::string& text, const std::string& filename) {
  size_t odd = 0;
  for (unsigned char c : text) {
    if (c == 0) return absl::InvalidArgumentError(absl::StrCat(filename, ": binary file (contains NUL bytes); expected protobuf text"));
    if (c < 9 || (c > 13 && c < 32) || c == 127) ++odd;
  }
  if (odd > text.size() / 20 + 1) {
    return absl::InvalidArgumentError(absl::StrCat(filename, ": does not look like text; expected protobuf text"));
  }
  return absl::OkStatus();
}

bool IsBlank(const std::string& text) {
  bool in_comment = false;
  for (char c : text) {
    if (in_comment) {
      if (c == '\n') in_comment = false;
    } else if (c == '#') {
      in_comment = true;
    } else if (!isspace(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return true;
}

// Text as editors write it: a UTF-8 byte-order mark (some Windows editors
// start a file with one) is dropped, and old Mac line ends (a CR alone)
// become LF, so that a comment ends at its line and lines count as the user
// sees them (CRLF is left: the parser reads its CR as space).
std::string NormalizeLineEnds(const std::string& raw) {
  std::string text = absl::StartsWith(raw, "\xEF\xBB\xBF") ? raw.substr(3) : raw;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r' && (i + 1 == text.size() || text[i + 1] != '\n')) text[i] = '\n';
  }
  return text;
}

template <typename M>
absl::StatusOr<M> ParseText(const std::string& raw, const std::string& filename, const char* what,
                            google::protobuf::TextFormat::ParseInfoTree* tree) {
  const std::string text = NormalizeLineEnds(raw);
  if (auto s = CheckLooksLikeText(text, filename); !s.ok()) return s;
  if (IsBlank(text)) return absl::InvalidArgumentError(absl::StrCat(filename, ": empty ", what));
  M message;
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (tree != nullptr) parser.WriteLocationsTo(tree);
  if (!parser.ParseFromString(text, &message)) {
    return absl::InvalidArgumentError(errors.has_error() ? ParseError(text, filename, errors)
                                                         : absl::StrCat(filename, ": cannot parse ", what));
  }
  return message;
}

}  // namespace

absl::StatusOr<Program> ParseProgramText(const std::string& text, const std::string& filename) {
  google::protobuf::TextFormat::ParseInfoTree tree;
  auto program = ParseText<Program>(text, filename, "program", &tree);
  if (!program.ok()) return program.status();
  const auto* op_field = Program::descriptor()->FindFieldByName("op");
  for (int i = 0; i < program->op_size(); ++i) {
    auto loc = tree.GetLocation(op_field, i);
    if (loc.line >= 0) program->mutable_op(i)->set_line(loc.line + 1);
  }
  const auto* var_field = Program::descriptor()->FindFieldByName("var");
  for (int i = 0; i < program->var_size(); ++i) {
    auto loc = tree.GetLocation(var_field, i);
    if (loc.line >= 0) program->mutable_var(i)->set_line(loc.line + 1);
  }
  program->set_source_file(filename);
  if (program->name().empty()) {
    // The file's stem, not its path: a program's identity (and fingerprint)
    // must not depend on the folder it was read from.
    std::string stem = filename.substr(filename.find_last_of('/') + 1);
    stem = stem.substr(0, stem.find('.'));
    // A name is UTF-8 without control characters (validation); a file's
    // name need not be, so its bytes are escaped ("caf\xe9") rather than
    // refused for a name the user never wrote.
    if (!IsValidUtf8(stem) || HasControlCharacter(stem)) stem = absl::CHexEscape(stem);
    program->set_name(stem);
  }
  return program;
}

absl::StatusOr<Strategy> ParseStrategyText(const std::string& text, const std::string& filename) {
  return ParseText<Strategy>(text, filename, "strategy", nullptr);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  // An ifstream opens a folder without complaint and reads nothing from it.
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a folder, expected a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  // Read in chunks up to a cap, so an endless special file (/dev/zero) cannot hang us.
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof(chunk)) || in.gcount() > 0) {
    text.append(chunk, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxTextFileBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": larger than ", kMaxTextFileBytes >> 20,
                                                     " MiB; expected a protobuf text file"));
    }
  }
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read file"));
  return text;
}

absl::StatusOr<Program> ReadProgramFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseProgramText(*text, path);
}

absl::StatusOr<Strategy> ReadStrategyFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseStrategyText(*text, path);
}

absl::StatusOr<RankPlan> ReadRankPlanFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseText<RankPlan>(*text, path, "rank plan", nullptr);
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot open for writing"));
    out << contents;
    out.flush();
    if (!out) return absl::DataLossError(absl::StrCat(tmp, ": write failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot rename ", tmp, " into place"));
  }
  return absl::OkStatus();
}

std::string ProgramToText(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::TextFormat::Printer printer;
  printer.SetUseShortRepeatedPrimitives(true);  // shape: [-1, 784]
  printer.PrintToString(message, &out);
  return out;
}

std::string OpLocation(absl::string_view file, int op_index, absl::string_view type, int line, absl::string_view name) {
  std::string where(file);
  if (line > 0) absl::StrAppend(&where, ":", line);
  absl::StrAppend(&where, ": op #", op_index, " '", type, "'");
  if (!name.empty()) absl::StrAppend(&where, " (", name, ")");
  return where;
}

std::string OpLocation(const Program& program, int op_index) {
  const Op& op = program.op(op_index);
  return OpLocation(program.source_file().empty() ? program.name() : program.source_file(), op_index, op.type(),
                    op.line(), op.name());
}

}  // namespace strata
