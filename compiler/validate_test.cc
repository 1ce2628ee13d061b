#include "compiler/validate.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "compiler/program_text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kHeader[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w1" dtype: F32 shape: [4, 8] kind: PARAM }
  var { name: "w2" dtype: F32 shape: [8, 3] kind: PARAM }
  optimizer { sgd { learning_rate: 0.1 } }
  loss: "loss"
)pb";

absl::StatusOr<Program> Validate(const std::string& body) {
  auto program = ParseProgramText(std::string(kHeader) + body, "test.pbtxt");
  if (!program.ok()) return program.status();
  if (auto s = ValidateAndInferProgram(&*program); !s.ok()) return s;
  return program;
}


TEST(ValidateTest, NamesLineAndOpForShapeMismatch) {
  auto p = Validate(R"pb(
    op { type: "matmul" input: ["x", "w2"] output: ["h"] }
    op { type: "softmax_cross_entropy" input: ["h", "label"] output: ["loss"] }
  )pb");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("test.pbtxt:9: op #0 'matmul'"));
}

TEST(ValidateTest, SuggestsNearestOpType) {
  auto p = Validate(R"pb(
    op { type: "matmull" input: ["x", "w1"] output: ["h"] }
  )pb");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("did you mean matmul"));
}

TEST(ValidateTest, RejectsUseBeforeDefinitionAndDoubleDefinition) {
  auto before = Validate(R"pb(
    op { type: "relu" input: ["h"] output: ["r"] }
    op { type: "matmul" input: ["x", "w1"] output: ["h"] }
  )pb");
  ASSERT_FALSE(before.ok());
  EXPECT_THAT(before.status().message(), HasSubstr("used before its definition by op #1"));
  auto twice = Validate(R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["h"] }
    op { type: "relu" input: ["h"] output: ["h"] }
  )pb");
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.status().message(), HasSubstr("defined twice"));
}

TEST(ValidateTest, RejectsNonScalarLoss) {
  auto p = Validate(R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["loss"] }
  )pb");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("must be a floating scalar"));
}

TEST(ValidateTest, ChecksUnusedDeclaredVars) {
  auto program = ParseProgramText(std::string(kHeader) + R"pb(
    var { name: "unused" dtype: F32 shape: [3, 0] kind: PARAM }
    op { type: "matmul" input: ["x", "w1"] output: ["h"] }
    op { type: "matmul" input: ["h", "w2"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb", "test.pbtxt");
  ASSERT_TRUE(program.ok());
  auto s = ValidateAndInferProgram(&*program);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("var 'unused'"));
  EXPECT_THAT(s.message(), HasSubstr("must be positive"));
}

TEST(ValidateTest, RejectsAbsurdSizes) {
  auto program = ParseProgramText(std::string(kHeader) + R"pb(
    var { name: "huge" dtype: F32 shape: [1000000000, 1000000000] kind: PARAM }
  )pb", "test.pbtxt");
  ASSERT_TRUE(program.ok());
  auto s = ValidateAndInferProgram(&*program);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("absurdly large"));
}

TEST(ProgramTextTest, ParseErrorsCarryLineAndColumn) {
  auto p = ParseProgramText("var { name: \"x\" }\nop { type: 3 x }\n", "bad.pbtxt");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("bad.pbtxt:2:"));
}

TEST(ProgramTextTest, AnUnclosedBraceIsNamedWhereItOpened) {
  // The var on line 4 never closes: the parser only stops at the op on line 5.
  const std::string text =
      "var { name: \"x\" dtype: F32 shape: [-1, 4] kind: FEED }\n"
      "# a comment with a { brace\n"
      "var { name: \"w\" dtype: F32 shape: [4, 3] kind: PARAM init { xavier_uniform {} } }\n"
      "  var { name: \"{ in a string\" dtype: F32 shape: [3] kind: PARAM\n"
      "op { type: \"matmul\" input: [\"x\", \"w\"] output: [\"y\"] }\n";
  auto p = ParseProgramText(text, "open.pbtxt");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("open.pbtxt:4:7: '{' opened here is never closed"));
  EXPECT_THAT(p.status().message(), HasSubstr("(the parser stopped at 5:4: "));
  // Cut off at the end of the file: the last brace left open.
  auto cut = ParseProgramText("optimizer { sgd { learning_rate: 0.1 }\n", "cut.pbtxt");
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(cut.status().message(), HasSubstr("cut.pbtxt:1:11: '{' opened here is never closed"));
  EXPECT_THAT(cut.status().message(), HasSubstr("got: the end of the file"));
  // A brace left open after the parser stopped is not the cause.
  auto later = ParseProgramText("var { name: \"x\" dtpe: F32 }\nvar {\n", "later.pbtxt");
  ASSERT_FALSE(later.ok());
  EXPECT_THAT(later.status().message(), HasSubstr("later.pbtxt:1:"));
  EXPECT_THAT(later.status().message(), HasSubstr("no field named \"dtpe\""));
  EXPECT_THAT(later.status().message(), Not(HasSubstr("never closed")));
}

TEST(ProgramTextTest, RejectsEmptyAndBinaryFiles) {
  auto empty = ParseProgramText("  # only a comment\n", "e.pbtxt");
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("empty program"));
  auto binary = ParseProgramText(std::string("\x00\x01\x02", 3), "b.pbtxt");
  ASSERT_FALSE(binary.ok());
  EXPECT_THAT(binary.status().message(), HasSubstr("binary file"));
}

// A byte-order mark and old Mac line ends (CR alone) parse as the same
// program, with the same line numbers; CRLF too.
// A program without a name takes its file's; a file name that is not UTF-8
// is escaped rather than refused (a name the user never wrote).
TEST(ProgramTextTest, ANameTakenFromAFileThatIsNotUtf8IsEscaped) {
  auto program = ParseProgramText(std::string(kHeader) + R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["h"] }
    op { type: "matmul" input: ["h", "w2"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb",
                                  "dir/caf\xe9.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_EQ(program->name(), "caf\\xe9");
  EXPECT_TRUE(ValidateAndInferProgram(&*program).ok());
}

TEST(ProgramTextTest, ByteOrderMarksAndCrLineEndsParseAsTheSameProgram) {
  const std::string lf = "# a comment\nvar { name: \"x\" dtype: F32 shape: [-1, 4] kind: FEED }\n";
  auto want = ParseProgramText(lf, "p.pbtxt");
  ASSERT_TRUE(want.ok()) << want.status();
  for (const std::string& text :
       {"\xEF\xBB\xBF" + lf, absl::StrReplaceAll(lf, {{"\n", "\r"}}), absl::StrReplaceAll(lf, {{"\n", "\r\n"}})}) {
    auto got = ParseProgramText(text, "p.pbtxt");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->SerializeAsString(), want->SerializeAsString());
    EXPECT_EQ(got->var(0).line(), 2);
  }
}

TEST(ValidateTest, ShapeErrorsNameTheVarBoundToEachRole) {
  auto p = Validate(R"pb(
    op { type: "matmul" input: ["x", "w2"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("test.pbtxt:9: op #0 'matmul': inner dims differ"));
  EXPECT_THAT(p.status().message(),
              HasSubstr("(where input 'a' is var 'x' F32[-1, 4] and input 'b' is var 'w2' F32[8, 3])"));
}

TEST(ValidateTest, DtypeErrorsNameTheVarBoundToEachRole) {
  auto p = Validate(R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["h"] }
    op { type: "matmul" input: ["h", "w2"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["label", "logits"] output: ["loss"] }
  )pb");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("op #2 'softmax_cross_entropy'"));
  EXPECT_THAT(p.status().message(), HasSubstr("input 'logits' is var 'label' I64[-1] and input 'label' is var "
                                              "'logits' F32[-1, 3]"));
}

TEST(ValidateTest, VariadicRolesAreIndexedAndLongListsCut) {
  // Ten tensors into concat: the first kMaxDescribedInputs are named.
  auto p = Validate(R"pb(
    op { type: "concat" input: ["x", "x", "x", "x", "x", "x", "x", "x", "x", "label"] output: ["c"] }
  )pb");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("input 'xs[0]' is var 'x' F32[-1, 4], input 'xs[1]' is var 'x'"));
  EXPECT_THAT(p.status().message(), HasSubstr("input 'xs[7]' is var 'x' F32[-1, 4] and 2 more inputs)"));
}

TEST(ValidateTest, VerifierErrorsNameTheVarBoundToEachRole) {
  auto p = Validate(R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["h"] }
    op { type: "matmul" input: ["h", "w2"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  ASSERT_TRUE(p.ok()) << p.status();
  // A pass that broke w2's shape.
  for (Var& v : *p->mutable_var()) {
    if (v.name() == "w2") v.set_shape(0, 5);
  }
  absl::Status s = VerifyProgram(*p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("op #1 'matmul': inner dims differ"));
  EXPECT_THAT(s.message(), HasSubstr("input 'a' is var 'h' F32[-1, 8] and input 'b' is var 'w2' F32[5, 3]"));
}

}  // namespace
}  // namespace strata
