// Walks the registries: every registered gradient-check case passes, every
// differentiable op has at least one case, and every op has a CPU kernel.

#include <algorithm>
#include <cctype>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "compiler/op_registry.h"
#include "compiler/testing/grad_check.h"
#include "compiler/testing/op_test_util.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "runtime/kernel.h"

namespace strata {

// gtest prints a case by its label, not its bytes (found by ADL, so in strata).
void PrintTo(const GradCheckCase& c, std::ostream* os) { *os << c.label; }

namespace {

class GradientCheck : public ::testing::TestWithParam<GradCheckCase> {};

TEST_P(GradientCheck, MatchesFiniteDifferences) {
  absl::Status s = CheckGradient(GetParam());
  EXPECT_TRUE(s.ok()) << s.message();
}

// gtest names allow only [A-Za-z0-9_]; duplicates get their index appended.
std::string CaseName(const ::testing::TestParamInfo<GradCheckCase>& info) {
  std::string name;
  for (char ch : info.param.label) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  const auto& cases = GradCheckRegistry::Global().cases();
  int same = 0;
  for (size_t i = 0; i < cases.size(); ++i) same += cases[i].label == info.param.label;
  if (name.empty() || same > 1) name += "_" + std::to_string(info.index);
  return name;
}

INSTANTIATE_TEST_SUITE_P(Registered, GradientCheck, ::testing::ValuesIn(GradCheckRegistry::Global().cases()),
                         CaseName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GradientCheck);

std::set<std::string> OpTypesWithCases() {
  std::set<std::string> types;
  for (const auto& c : GradCheckRegistry::Global().cases()) {
    Op op;
    if (google::protobuf::TextFormat::ParseFromString(c.op_text, &op)) types.insert(op.type());
  }
  return types;
}

TEST(GradientCheckCoverage, EveryDifferentiableOpHasACase) {
  std::set<std::string> covered = OpTypesWithCases();
  std::vector<std::string> missing;
  for (const auto& name : OpRegistry::Global().Names()) {
    const OpSchema* schema = OpRegistry::Global().Find(name);
    if (schema->differentiable && !covered.count(name)) missing.push_back(name);
  }
  EXPECT_TRUE(missing.empty()) << "differentiable ops without a gradient-check case (add one to "
                                  "compiler/ops/<family>_gradcheck.cc): "
                               << absl::StrJoin(missing, ", ");
}

TEST(GradientCheckCoverage, EveryCaseNamesARegisteredDifferentiableOp) {
  std::vector<std::string> bad;
  for (const auto& c : GradCheckRegistry::Global().cases()) {
    Op op;
    if (!google::protobuf::TextFormat::ParseFromString(c.op_text, &op)) {
      bad.push_back(c.label + " (op_text does not parse)");
      continue;
    }
    const OpSchema* schema = OpRegistry::Global().Find(op.type());
    if (schema == nullptr) {
      bad.push_back(c.label + " (unknown op '" + op.type() + "')");
    } else if (!schema->differentiable) {
      bad.push_back(c.label + " ('" + op.type() + "' is not differentiable)");
    }
  }
  EXPECT_TRUE(bad.empty()) << absl::StrJoin(bad, ", ");
}

// An op needs a CPU kernel for F32, or, when it has no floating kernels at
// all, for its natural integer dtype (ops on ids only).
TEST(KernelCoverage, EveryOpHasACpuKernel) {
  std::vector<std::string> missing;
  for (const auto& name : OpRegistry::Global().Names()) {
    std::vector<DataType> dtypes = KernelRegistry::Global().DtypesFor(name, DEVICE_CPU);
    bool has_f32 = std::count(dtypes.begin(), dtypes.end(), F32) > 0;
    bool has_f64 = std::count(dtypes.begin(), dtypes.end(), F64) > 0;
    if (has_f32 || (!dtypes.empty() && !has_f64)) continue;
    std::vector<std::string> have;
    for (DataType d : dtypes) have.push_back(DataTypeName(d));
    missing.push_back(name + (have.empty() ? " (none)" : " (only " + absl::StrJoin(have, ", ") + ")"));
  }
  EXPECT_TRUE(missing.empty()) << "ops without a CPU kernel for F32: " << absl::StrJoin(missing, ", ");
}

// Gradient checks run in F64, so a differentiable op needs an F64 kernel too.
TEST(KernelCoverage, EveryDifferentiableOpHasAnF64CpuKernel) {
  std::vector<std::string> missing;
  for (const auto& name : OpRegistry::Global().Names()) {
    if (!OpRegistry::Global().Find(name)->differentiable) continue;
    if (KernelRegistry::Global().Find(name, DEVICE_CPU, F64) == nullptr) missing.push_back(name);
  }
  EXPECT_TRUE(missing.empty()) << "differentiable ops without a CPU kernel for F64: " << absl::StrJoin(missing, ", ");
}

}  // namespace
}  // namespace strata
