#include "proto/shape_rules.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }


}  // namespace

// ---- axes -------------------------------------------------------------------

absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank, absl::string_view what) {
  if (axis < -rank || axis >= rank) {
    return Invalid(absl::StrCat(what, " = ", axis, " is out of range for rank ", rank, " (expected ", -rank, " to ",
                                rank - 1, ")"));
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

absl::StatusOr<int> NormalizeInputAxis(int64_t axis, int rank, absl::string_view input) {
  if (rank == 0) return Invalid(absl::StrCat("input '", input, "' must have rank >= 1, got a scalar"));
  if (axis < -rank || axis >= rank) {
    return Invalid(absl::StrCat("attr 'axis' is ", axis, ", out of range for input '", input, "' of rank ", rank,
                                " (expected ", -rank, "..", rank - 1, ")"));
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

// ---- reductions -------------------------------------------------------------

absl::StatusOr<std::vector<bool>> ReducedAxes(absl::Span<const int64_t> axis, int rank, absl::string_view input) {
  std::vector<bool> reduced(rank, axis.empty());
  for (int64_t a : axis) {
    if (a < -rank || a >= rank) {
      return Invalid(absl::StrCat("attr 'axis' has ", a, ", out of range for input '", input, "' of rank ", rank,
                                  " (expected ", -rank, "..", rank - 1, ")"));
    }
    const int64_t d = a < 0 ? a + rank : a;
    if (reduced[d]) return Invalid(absl::StrCat("attr 'axis' names dim ", d, " twice"));
    reduced[d] = true;
  }
  return reduced;
}

Shape ReduceShape(absl::Span<const int64_t> shape, const std::vector<bool>& reduced, bool keepdim) {
  Shape out;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!reduced[i]) {
      out.push_back(shape[i]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

// ---- reshape, flatten, transpose --------------------------------------------

absl::StatusOr<Shape> BroadcastShapes(absl::Span<const int64_t> a, absl::Span<const int64_t> b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t k = 0; k < n; ++k) {
    int64_t da = k < n - a.size() ? 1 : a[k - (n - a.size())];
    int64_t db = k < n - b.size() ? 1 : b[k - (n - b.size())];
    if (da == db || db == 1) {
      out[k] = da;
    } else if (da == 1) {
      out[k] = db;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("shapes ", ShapeString(a), " and ", ShapeString(b), " do not broadcast"));
    }
  }
  return out;
}

absl::StatusOr<MatmulDims> ResolveMatmul(absl::Span<const int64_t> a, absl::Span<const int64_t> b, bool transpose_a,
                                         bool transpose_b) {
  if (a.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("input 'a' must have rank >= 2, got ", ShapeString(a)));
  }
  if (b.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("input 'b' must have rank >= 2, got ", ShapeString(b)));
  }
  MatmulDims d;
  d.b_batched = b.size() > 2;
  if (d.b_batched) {
    if (a.size() != b.size()) {
      return absl::InvalidArgumentError(absl::StrCat("a batched 'b' (", ShapeString(b),
                                                     ") needs 'a' of the same rank, got ", ShapeString(a),
                                                     " (or make 'b' 2-D to share it over a's batch)"));
    }
    for (size_t i = 0; i + 2 < a.size(); ++i) {
      if (a[i] != b[i]) {
        return absl::InvalidArgumentError(absl::StrCat("batch dims of 'a' ", ShapeString(a), " and 'b' ",
                                                       ShapeString(b), " differ in dim ", i));
      }
    }
  }
  const size_t ra = a.size(), rb = b.size();
  d.batch.assign(a.begin(), a.end() - 2);
  d.m = transpose_a ? a[ra - 1] : a[ra - 2];
  d.k = transpose_a ? a[ra - 2] : a[ra - 1];
  const int64_t kb = transpose_b ? b[rb - 1] : b[rb - 2];
  d.n = transpose_b ? b[rb - 2] : b[rb - 1];
  if (d.k != kb) {
    return absl::InvalidArgumentError(absl::StrCat("inner dims differ: 'a' ", ShapeString(a),
                                                   transpose_a ? " (transposed)" : "", " contributes K=", d.k,
                                                   " but 'b' ", ShapeString(b), transpose_b ? " (transposed)" : "",
                                                   " contributes K=", kb));
  }
  return d;
}

absl::StatusOr<Shape> ResolveReshape(absl::Span<const int64_t> in, absl::Span<const int64_t> spec) {
  Shape out(spec.size());
  int infer = -1;
  int copied_unknown = 0;
  int64_t known_out = 1;
  for (size_t i = 0; i < spec.size(); ++i) {
    const int64_t v = spec[i];
    if (v == -1) {
      if (infer >= 0) return Invalid(absl::StrCat("attr 'shape' ", ShapeString(spec), " has more than one -1"));
      infer = static_cast<int>(i);
    } else if (v == 0) {
      if (i >= in.size()) {
        return Invalid(absl::StrCat("attr 'shape' ", ShapeString(spec), ": entry ", i, " is 0 (copy input dim ", i,
                                    ") but the input has rank ", in.size()));
      }
      out[i] = in[i];
      if (in[i] < 0) {
        ++copied_unknown;
      } else if (__builtin_mul_overflow(known_out, in[i], &known_out)) {
        return Invalid(absl::StrCat("attr 'shape' ", ShapeString(spec), " holds more than 2^63 elements"));
      }
    } else if (v < 0) {
      return Invalid(absl::StrCat("attr 'shape' ", ShapeString(spec), ": entry ", i, " is ", v,
                                  "; expected a size, 0 (copy the input dim) or -1 (infer)"));
    } else {
      out[i] = v;
      if (__builtin_mul_overflow(known_out, v, &known_out)) {
        return Invalid(absl::StrCat("attr 'shape' ", ShapeString(spec), " holds more than 2^63 elements"));
      }
    }
  }
  const int64_t known_in = KnownProduct(in);
  const int unknown = CountUnknown(in) - copied_unknown;  // batch dims not placed by a 0
  // Built only on failure: the kernel resolves its shape at every step.
  auto cannot = [&](const auto&... why) {
    return Invalid(absl::StrCat("cannot reshape ", ShapeString(in), " to ", ShapeString(spec), ": ", why...));
  };
  if (infer < 0) {
    if (unknown > 0) return cannot("the input's batch dim (-1) must go to a -1 or 0 entry");
    if (known_in != known_out) return cannot(known_in, " elements into ", known_out);
    return out;
  }
  if (unknown > 1) return cannot("it would merge ", unknown, " unknown dims into one");
  if (unknown == 1) {
    // The -1 stays the batch dim only if the other dims hold the rest exactly.
    if (known_in != known_out) {
      return cannot("the -1 stands for the batch dim, so the other dims must hold ", known_in,
                    " elements per batch entry, not ", known_out);
    }
    out[infer] = -1;
    return out;
  }
  if (known_out == 0 || known_in % known_out != 0) {
    return cannot(known_in, " elements do not divide into dims of ", known_out);
  }
  out[infer] = known_in / known_out;
  return out;
}

absl::StatusOr<Shape> FlattenShape(absl::Span<const int64_t> in, int64_t start_axis, int64_t end_axis) {
  const int rank = static_cast<int>(in.size());
  absl::StatusOr<int> start = NormalizeAxis(start_axis, rank, "attr 'start_axis'");
  if (!start.ok()) return start.status();
  absl::StatusOr<int> end = NormalizeAxis(end_axis, rank, "attr 'end_axis'");
  if (!end.ok()) return end.status();
  if (*start > *end) {
    return Invalid(absl::StrCat("attr 'start_axis' (", *start, ") is after 'end_axis' (", *end, ")"));
  }
  const absl::Span<const int64_t> merged_dims = in.subspan(*start, *end - *start + 1);
  const int64_t merged = KnownProduct(merged_dims);
  const int unknown = CountUnknown(merged_dims);
  if (unknown > 0 && (merged != 1 || unknown > 1)) {
    return Invalid(absl::StrCat("flattening axes ", *start, " to ", *end,
                                " would merge the batch dim (-1) with other dims"));
  }
  Shape out(in.begin(), in.begin() + *start);
  out.push_back(unknown > 0 ? -1 : merged);
  out.insert(out.end(), in.begin() + *end + 1, in.end());
  return out;
}

absl::StatusOr<Shape> NormalizePerm(absl::Span<const int64_t> perm, int rank) {
  if (static_cast<int>(perm.size()) != rank) {
    return Invalid(absl::StrCat("attr 'perm' ", ShapeString(perm), " must have one entry per input dim (", rank, ")"));
  }
  Shape out(rank);
  std::vector<bool> seen(rank, false);
  for (int i = 0; i < rank; ++i) {
    absl::StatusOr<int> axis = NormalizeAxis(perm[i], rank, absl::StrCat("attr 'perm'[", i, "]"));
    if (!axis.ok()) return axis.status();
    if (seen[*axis]) return Invalid(absl::StrCat("attr 'perm' ", ShapeString(perm), " is not a permutation"));
    seen[*axis] = true;
    out[i] = *axis;
  }
  return out;
}

// ---- split, slice -------------------------------------------------------------

absl::StatusOr<Shape> SplitSizes(int64_t dim, int n, absl::Span<const int64_t> sections) {
  if (sections.empty()) {
    if (n < 1) return Invalid(absl::StrCat("cannot split a dim into ", n, " parts"));
    if (dim < 0) {
      if (n == 1) return Shape{-1};
      return Invalid(absl::StrCat("cannot split the batch dim (-1) into ", n, " parts"));
    }
    if (dim % n != 0) {
      return Invalid(absl::StrCat("cannot split a dim of ", dim, " into ", n,
                                  " equal parts; give the sizes in attr 'sections'"));
    }
    return Shape(n, dim / n);
  }
  if (static_cast<int>(sections.size()) != n) {
    return Invalid(absl::StrCat("attr 'sections' ", ShapeString(sections), " has ", sections.size(), " entries for ",
                                n, " outputs"));
  }
  Shape sizes(sections.begin(), sections.end());
  int infer = -1;
  int64_t known = 0;
  for (int i = 0; i < n; ++i) {
    if (sections[i] == -1 && infer < 0) {
      infer = i;
    } else if (sections[i] < 0) {
      return Invalid(absl::StrCat("attr 'sections' ", ShapeString(sections),
                                  ": sizes must be 0 or more, with at most one -1 (the rest)"));
    } else if (__builtin_add_overflow(known, sections[i], &known)) {
      return Invalid(absl::StrCat("attr 'sections' ", ShapeString(sections), " adds up to more than 2^63"));
    }
  }
  if (dim < 0) {
    if (n == 1 && infer == 0) return sizes;
    return Invalid(absl::StrCat("cannot split the batch dim (-1) by attr 'sections' ", ShapeString(sections)));
  }
  if (infer >= 0) {
    if (known > dim) {
      return Invalid(absl::StrCat("attr 'sections' ", ShapeString(sections), " adds up to more than the dim (", dim,
                                  ")"));
    }
    sizes[infer] = dim - known;
  } else if (known != dim) {
    return Invalid(absl::StrCat("attr 'sections' ", ShapeString(sections), " adds up to ", known,
                                ", not to the dim (", dim, ")"));
  }
  return sizes;
}

absl::StatusOr<SliceWindow> ResolveSlice(absl::Span<const int64_t> in, absl::Span<const int64_t> axes,
                                         absl::Span<const int64_t> starts, absl::Span<const int64_t> ends) {
  if (starts.size() != axes.size() || ends.size() != axes.size()) {
    return Invalid(absl::StrCat("attrs 'axes' ", ShapeString(axes), ", 'starts' ", ShapeString(starts),
                                " and 'ends' ", ShapeString(ends), " must have the same length"));
  }
  const int rank = static_cast<int>(in.size());
  SliceWindow window{Shape(rank, 0), Shape(in.begin(), in.end())};
  std::vector<bool> seen(rank, false);
  for (size_t k = 0; k < axes.size(); ++k) {
    absl::StatusOr<int> axis = NormalizeAxis(axes[k], rank, absl::StrCat("attr 'axes'[", k, "]"));
    if (!axis.ok()) return axis.status();
    if (seen[*axis]) return Invalid(absl::StrCat("attr 'axes' ", ShapeString(axes), " names axis ", *axis, " twice"));
    seen[*axis] = true;
    const int64_t dim = in[*axis];
    if (dim < 0) {
      if (starts[k] == 0 && ends[k] >= kSliceToTheEnd) continue;  // the whole batch
      return Invalid(absl::StrCat("cannot slice axis ", *axis, ", the batch dim (-1), by [", starts[k], ", ", ends[k],
                                  "): only [0, end) is allowed there"));
    }
    const int64_t s = starts[k] < 0 ? std::max<int64_t>(starts[k] + dim, 0) : std::min(starts[k], dim);
    const int64_t e = ends[k] < 0 ? std::max<int64_t>(ends[k] + dim, 0) : std::min(ends[k], dim);
    window.begin[*axis] = s;
    window.size[*axis] = std::max<int64_t>(e - s, 0);
  }
  return window;
}

int64_t KnownProduct(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d >= 0) n *= d;
  }
  return n;
}

int CountUnknown(absl::Span<const int64_t> shape) {
  return static_cast<int>(std::count_if(shape.begin(), shape.end(), [](int64_t d) { return d < 0; }));
}

absl::StatusOr<std::vector<bool>> SumToLikeDims(absl::Span<const int64_t> x, absl::Span<const int64_t> like,
                                                bool* any) {
  const int rank = static_cast<int>(x.size()), lead = rank - static_cast<int>(like.size());
  if (lead < 0) {
    return absl::InvalidArgumentError(absl::StrCat("like ", ShapeString(like), " has more dims than x ", ShapeString(x)));
  }
  std::vector<bool> reduced(rank, false);
  *any = false;
  for (int d = 0; d < rank; ++d) {
    if (d < lead) {
      reduced[d] = true;
    } else if (like[d - lead] != x[d]) {
      if (like[d - lead] != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("like ", ShapeString(like), " does not broadcast to x ", ShapeString(x)));
      }
      reduced[d] = true;
    }
    *any = *any || (reduced[d] && x[d] != 1);  // summing a size-1 dim changes nothing
  }
  return reduced;
}

// ---- scaled_dot_product_attention ---------------------------------------------

absl::StatusOr<AttentionLayout> ParseAttentionLayout(absl::string_view layout) {
  if (layout == "bhtd") return AttentionLayout::kBhtd;
  if (layout == "bthd") return AttentionLayout::kBthd;
  return Invalid(absl::StrCat("attr 'layout' must be \"bhtd\" ([B, H, T, D]) or \"bthd\" ([B, T, H, D]), got \"",
                              layout, "\""));
}

}  // namespace strata
