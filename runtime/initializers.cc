#include "runtime/initializers.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/status_macros.h"
#include "runtime/philox.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

constexpr double kPi = 3.14159265358979323846;
// Philox blocks (4 elements each) per ParallelFor chunk: small vars fill inline.
constexpr int64_t kBlocksPerChunk = 4096;
// Truncated normals redraw an out-of-range element from counters (attempt, block)
// for attempt = 1, 2, ...; each attempt fails with p = 0.046, so the cap is
// never reached in practice (the element would fall back to the mean).
constexpr uint64_t kMaxTruncatedAttempts = 64;

absl::Status VarError(const Var& var, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("var '", var.name(), "': ", what));
}

// The distribution every element is drawn from, in the var's own units.
struct Distribution {
  enum Kind { kUniform, kNormal, kTruncatedNormal } kind;
  double a = 0, b = 0;  // uniform: [low, high); normals: mean, std
};

// Four standard normals from the four uniforms of block `block`, drawn under
// `attempt`: Box-Muller over lane pairs (0, 1) and (2, 3).
std::array<double, 4> NormalBlock(const Philox& philox, uint64_t attempt, uint64_t block) {
  std::array<double, 4> u = philox.Uniform4(attempt, block);
  std::array<double, 4> z;
  for (int pair = 0; pair < 4; pair += 2) {
    // 1 - u lies in (0, 1], so the log never sees 0.
    const double radius = std::sqrt(-2.0 * std::log(1.0 - u[pair]));
    const double theta = 2.0 * kPi * u[pair + 1];
    z[pair] = radius * std::cos(theta);
    z[pair + 1] = radius * std::sin(theta);
  }
  return z;
}

// The values of the four elements of block `block` (a pure function of it).
std::array<double, 4> SampleBlock(const Distribution& d, const Philox& philox, uint64_t block) {
  std::array<double, 4> v;
  switch (d.kind) {
    case Distribution::kUniform: {
      std::array<double, 4> u = philox.Uniform4(0, block);
      for (int l = 0; l < 4; ++l) v[l] = d.a + (d.b - d.a) * u[l];
      break;
    }
    case Distribution::kNormal: {
      std::array<double, 4> z = NormalBlock(philox, 0, block);
      for (int l = 0; l < 4; ++l) v[l] = d.a + d.b * z[l];
      break;
    }
    case Distribution::kTruncatedNormal: {
      std::array<double, 4> z = NormalBlock(philox, 0, block);
      for (int l = 0; l < 4; ++l) {
        for (uint64_t attempt = 1; std::abs(z[l]) > 2.0; ++attempt) {
          z[l] = attempt < kMaxTruncatedAttempts ? NormalBlock(philox, attempt, block)[l] : 0.0;
        }
        v[l] = d.a + d.b * z[l];
      }
      break;
    }
  }
  return v;
}

// Rounds to T; a uniform draw that rounds up onto `high` steps back below it.
template <typename T>
T Store(const Distribution& d, double v) {
  T x = static_cast<T>(v);
  if (d.kind == Distribution::kUniform && d.a < d.b && static_cast<double>(x) >= d.b) {
    x = std::nextafter(x, static_cast<T>(-INFINITY));
    if (static_cast<double>(x) < d.a) x = static_cast<T>(d.a);
  }
  return x;
}

// Split over blocks of four elements; each chunk of blocks is independent.
template <typename T>
void Sample(const Distribution& d, const Philox& philox, T* out, int64_t n) {
  const int64_t num_blocks = (n + 3) / 4;
  ParallelFor(num_blocks, kBlocksPerChunk, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      std::array<double, 4> v = SampleBlock(d, philox, static_cast<uint64_t>(block));
      for (int l = 0; l < 4; ++l) {
        const int64_t i = 4 * block + l;
        if (i < n) out[i] = Store<T>(d, v[l]);
      }
    }
  });
}

// (fan_in, fan_out) in our layouts: [in, out] matrices, [O, C, kh, kw] filters.
absl::StatusOr<std::pair<double, double>> Fans(const Var& var, const char* init) {
  const int rank = var.shape_size();
  if (rank == 0) return VarError(var, absl::StrCat(init, " needs a tensor of rank >= 1, got a scalar"));
  if (rank == 1) return std::make_pair(static_cast<double>(var.shape(0)), static_cast<double>(var.shape(0)));
  double receptive_field = 1;
  for (int k = 2; k < rank; ++k) receptive_field *= static_cast<double>(var.shape(k));
  if (rank == 2) return std::make_pair(static_cast<double>(var.shape(0)), static_cast<double>(var.shape(1)));
  return std::make_pair(static_cast<double>(var.shape(1)) * receptive_field,
                        static_cast<double>(var.shape(0)) * receptive_field);
}

absl::Status ExpectFinite(const Var& var, const char* field, double v) {
  if (!std::isfinite(v)) return VarError(var, absl::StrCat(field, " must be finite, got ", v));
  return absl::OkStatus();
}

// The distribution of a random initializer, validated.
absl::StatusOr<Distribution> DistributionOf(const Var& var) {
  const Initializer& init = var.init();
  switch (init.kind_case()) {
    case Initializer::kUniform: {
      const double low = init.uniform().low(), high = init.uniform().high();
      STRATA_RETURN_IF_ERROR(ExpectFinite(var, "uniform.low", low));
      STRATA_RETURN_IF_ERROR(ExpectFinite(var, "uniform.high", high));
      if (low > high) return VarError(var, absl::StrCat("uniform needs low <= high, got low ", low, " > high ", high));
      return Distribution{Distribution::kUniform, low, high};
    }
    case Initializer::kNormal:
    case Initializer::kTruncatedNormal: {
      const bool truncated = init.kind_case() == Initializer::kTruncatedNormal;
      const Initializer::Normal& n = truncated ? init.truncated_normal() : init.normal();
      const char* name = truncated ? "truncated_normal" : "normal";
      STRATA_RETURN_IF_ERROR(ExpectFinite(var, absl::StrCat(name, ".mean").c_str(), n.mean()));
      STRATA_RETURN_IF_ERROR(ExpectFinite(var, absl::StrCat(name, ".std").c_str(), n.std()));
      if (n.std() < 0) return VarError(var, absl::StrCat(name, ".std must be >= 0, got ", n.std()));
      return Distribution{truncated ? Distribution::kTruncatedNormal : Distribution::kNormal, n.mean(), n.std()};
    }
    case Initializer::kXavierUniform:
    case Initializer::kXavierNormal: {
      const bool uniform = init.kind_case() == Initializer::kXavierUniform;
      const char* name = uniform ? "xavier_uniform" : "xavier_normal";
      const Initializer::Xavier& x = uniform ? init.xavier_uniform() : init.xavier_normal();
      const double gain = x.has_gain() ? x.gain() : 1.0;
      STRATA_RETURN_IF_ERROR(ExpectFinite(var, absl::StrCat(name, ".gain").c_str(), gain));
      if (gain < 0) return VarError(var, absl::StrCat(name, ".gain must be >= 0, got ", gain));
      auto fans = Fans(var, name);
      if (!fans.ok()) return fans.status();
      // Glorot & Bengio: std = gain * sqrt(2 / (fan_in + fan_out)).
      const double std = gain * std::sqrt(2.0 / (fans->first + fans->second));
      if (uniform) return Distribution{Distribution::kUniform, -std::sqrt(3.0) * std, std::sqrt(3.0) * std};
      return Distribution{Distribution::kNormal, 0.0, std};
    }
    case Initializer::kKaimingUniform:
    case Initializer::kKaimingNormal: {
      const bool uniform = init.kind_case() == Initializer::kKaimingUniform;
      const char* name = uniform ? "kaiming_uniform" : "kaiming_normal";
      const Initializer::Kaiming& k = uniform ? init.kaiming_uniform() : init.kaiming_normal();
      STRATA_RETURN_IF_ERROR(ExpectFinite(var, absl::StrCat(name, ".a").c_str(), k.a()));
      auto fans = Fans(var, name);
      if (!fans.ok()) return fans.status();
      // He et al.: std = gain / sqrt(fan), gain = sqrt(2 / (1 + a^2)) for leaky_relu slope a.
      const double gain = std::sqrt(2.0 / (1.0 + k.a() * k.a()));
      const double std = gain / std::sqrt(k.fan_out() ? fans->second : fans->first);
      if (uniform) return Distribution{Distribution::kUniform, -std::sqrt(3.0) * std, std::sqrt(3.0) * std};
      return Distribution{Distribution::kNormal, 0.0, std};
    }
    default:
      return absl::InternalError(absl::StrCat("var '", var.name(), "': not a random initializer"));
  }
}

}  // namespace

absl::StatusOr<Tensor> InitializeParam(const Var& var, uint64_t seed, Allocator* allocator) {
  const DataType dtype = var.dtype();
  if (!DataType_IsValid(dtype) || DataTypeSize(dtype) == 0) {
    return VarError(var, absl::StrCat("has no valid dtype (", DataTypeName(dtype), ")"));
  }
  Shape shape;
  for (int64_t d : var.shape()) {
    if (d < 0) {
      return VarError(var, absl::StrCat("shape ", ShapeString(var.shape()),
                                        " has a batch dimension (-1); a persistent var needs a static shape"));
    }
    shape.push_back(d);
  }
  const Initializer& init = var.init();

  // Validate before allocating, so a bad file fails fast whatever the size.
  Distribution distribution{Distribution::kUniform};
  const Initializer::KindCase kind = init.kind_case();
  const bool random = kind != Initializer::KIND_NOT_SET && kind != Initializer::kConstant;
  if (random) {
    if (!IsFloating(dtype)) {
      return VarError(var, absl::StrCat("a random initializer needs dtype F32 or F64, got ", DataTypeName(dtype)));
    }
    auto d = DistributionOf(var);
    if (!d.ok()) return d.status();
    distribution = *d;
  } else if (kind == Initializer::kConstant) {
    const double value = init.constant().value();
    STRATA_RETURN_IF_ERROR(ExpectFinite(var, "constant.value", value));
    if (!IsFloating(dtype) && value != std::trunc(value)) {
      return VarError(var, absl::StrCat("constant ", value, " is not a whole number for dtype ", DataTypeName(dtype)));
    }
  }

  Tensor t = Tensor::Empty(dtype, shape, allocator);
  if (!t.defined()) {
    return absl::ResourceExhaustedError(absl::StrCat("var '", var.name(), "': out of memory allocating ",
                                                     DataTypeName(dtype), ShapeString(var.shape()), " on ",
                                                     allocator->name()));
  }
  if (!random) {
    t.Fill(kind == Initializer::kConstant ? init.constant().value() : 0.0);
    return t;
  }
  const Philox philox(MixKey(seed, Fnv1a64(var.name())));
  if (dtype == F32) {
    Sample(distribution, philox, t.data<float>(), t.num_elements());
  } else {
    Sample(distribution, philox, t.data<double>(), t.num_elements());
  }
  return t;
}

#undef STRATA_RETURN_IF_ERROR

}  // namespace strata
