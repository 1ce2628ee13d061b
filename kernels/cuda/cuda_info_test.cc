// The CUDA libraries link and load, at the versions the headers promised
// (same major version; cudart is static, so exactly the toolkit's). Needs no
// GPU.

#include "kernels/cuda/cuda_info.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace cuda {
namespace {

using ::testing::HasSubstr;

TEST(CudaInfoTest, LoadedLibrariesMatchTheHeadersMajorVersions) {
  const CudaVersions built = CompiledCudaVersions();
  const CudaVersions loaded = LoadedCudaVersions();
  EXPECT_EQ(loaded.runtime, built.runtime);
  // Major versions: runtime and cuBLASLt 10000, cuDNN 10000 (since 9.0), NCCL 10000 (since 2.9).
  EXPECT_GT(loaded.cublaslt, 0u);
  EXPECT_EQ(loaded.cublaslt / 10000, built.cublaslt / 10000) << "cuBLASLt " << loaded.cublaslt;
  EXPECT_GT(loaded.cudnn, 0u);
  EXPECT_EQ(loaded.cudnn / 10000, built.cudnn / 10000) << "cuDNN " << loaded.cudnn;
  EXPECT_GT(loaded.nccl, 0);
  EXPECT_EQ(loaded.nccl / 10000, built.nccl / 10000) << "NCCL " << loaded.nccl;
}

TEST(CudaInfoTest, DescribesEveryLibrary) {
  const std::string text = DescribeCuda();
  EXPECT_THAT(text, HasSubstr("CUDA runtime "));
  EXPECT_THAT(text, HasSubstr("cuBLASLt "));
  EXPECT_THAT(text, HasSubstr("cuDNN "));
  EXPECT_THAT(text, HasSubstr("NCCL "));
  // Either a device line or the reason there is none.
  if (CudaDeviceCount() > 0) {
    EXPECT_THAT(text, HasSubstr("device 0: "));
  } else {
    EXPECT_THAT(text, HasSubstr("no CUDA device: "));
  }
}

}  // namespace
}  // namespace cuda
}  // namespace strata
