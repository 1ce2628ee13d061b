// binary.cu's same-shape path (add, sub, mul, div), launchers included, on
// the CPU: the genrule binary_emulated_src rewrites the file's <<<>>>
// launches into calls of testing/cuda_stand_in/'s Launch, and g++ compiles
// it against the stand-ins. elementwise.cuh's 16-byte packs where every
// operand is aligned (then the tail one by one), else one element a thread:
// both give the registered CPU kernels' bits, out of place and in place.

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/binary.h"
#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"
#include "kernels/cuda/testing/emulation_test_util.h"

namespace strata {
namespace {

struct Case {
  const char* op;
  cuda::BinaryOp binary;
};

template <typename T>
void CheckSameShape(DataType dtype) {
  for (const Case& c : {Case{"add", cuda::BinaryOp::kAdd}, Case{"sub", cuda::BinaryOp::kSub},
                        Case{"mul", cuda::BinaryOp::kMul}, Case{"div", cuda::BinaryOp::kDiv}}) {
    for (int64_t offset : {0, 1}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1499}}) {
        SCOPED_TRACE(testing::Message() << c.op << " " << DataTypeName(dtype) << ", offset " << offset << ", n "
                                        << n);
        std::map<std::string, Tensor> env = {{"x", MakeTensor(dtype, {n}, emulation::UniformValues(n, 41, 9))},
                                             {"y", MakeTensor(dtype, {n}, emulation::UniformValues(n, 42, 3))}};
        const absl::Status s =
            RunOp(ParseOp(std::string(R"pb(type: ")pb") + c.op + R"pb(" input: [ "x", "y" ] output: "z")pb"), &env);
        ASSERT_TRUE(s.ok()) << s;
        // Operands moved `offset` elements off their allocation's alignment.
        std::vector<T> x(n + 1), y(n + 1);
        std::memcpy(x.data() + offset, env["x"].data<T>(), n * sizeof(T));
        std::memcpy(y.data() + offset, env["y"].data<T>(), n * sizeof(T));
        std::vector<T> z = emulation::Poisoned<T>(n + 1);
        const int64_t launches = cuda_stand_in::launches;
        ASSERT_EQ(cuda::LaunchBinarySameShape(c.binary, z.data() + offset, x.data() + offset, y.data() + offset, n,
                                              nullptr),
                  cudaSuccess);
        emulation::ExpectCleanLaunches();
        // 16-byte packs of 16 / sizeof(T) elements where aligned, and the tail.
        const int64_t pack = 16 / sizeof(T);
        const int64_t want_launches = offset == 0 && n >= pack ? (n % pack != 0 ? 2 : 1) : 1;
        EXPECT_EQ(cuda_stand_in::launches - launches, want_launches);
        EXPECT_TRUE(emulation::SameBits(z.data() + offset, n, env["z"], "z"));
        // In place: z over x.
        ASSERT_EQ(cuda::LaunchBinarySameShape(c.binary, x.data() + offset, x.data() + offset, y.data() + offset, n,
                                              nullptr),
                  cudaSuccess);
        emulation::ExpectCleanLaunches();
        EXPECT_TRUE(emulation::SameBits(x.data() + offset, n, env["z"], "z over x"));
      }
    }
  }
}

TEST(BinaryEmulation, SameShapePacksAndSingleElementsGiveTheCpuBits) {
  CheckSameShape<float>(F32);
  CheckSameShape<double>(F64);
}

}  // namespace
}  // namespace strata
