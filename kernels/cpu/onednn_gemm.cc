#include "kernels/cpu/onednn_gemm.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

// OneOpenMpThread keeps oneDNN to the calling thread through OpenMP; a
// oneDNN built on TBB or a threadpool would ignore it and start its own
// threads beside Strata's pool.
#if DNNL_CPU_RUNTIME != DNNL_RUNTIME_OMP
#error "kernels/cpu/onednn_gemm.cc expects oneDNN's OpenMP build (Debian's libdnnl-dev)"
#endif

#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cpu/gemm.h"
#include "kernels/env_switch.h"
#include "proto/status_macros.h"
#include "runtime/device.h"
#include "runtime/float16.h"

namespace strata {
namespace {

// The GEMM's description: the operands' type, transposes, sizes, leading
// dimensions, and alpha's and beta's bits (a primitive bakes in its output
// scale and sum post-op).
struct GemmKey {
  dnnl_data_type_t operands = dnnl_bf16;  // dnnl_bf16 or dnnl_f32; c is float
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  uint32_t alpha_bits = 0, beta_bits = 0;

  auto Tie() const { return std::tie(operands, ta, tb, m, n, k, lda, ldb, ldc, alpha_bits, beta_bits); }
  bool operator==(const GemmKey& o) const { return Tie() == o.Tie(); }
  template <typename H>
  friend H AbslHashValue(H h, const GemmKey& key) {
    return H::combine(std::move(h), static_cast<int>(key.operands), key.ta, key.tb, key.m, key.n, key.k, key.lda,
                      key.ldb, key.ldc, key.alpha_bits, key.beta_bits);
  }
};

struct Primitive {
  dnnl_primitive_t primitive = nullptr;
  // Its memory descriptors, kept so a call makes its memory objects without
  // asking the primitive again.
  dnnl_memory_desc_t a_md, b_md, c_md, scratchpad_md;
  size_t scratchpad_bytes = 0;
  std::string impl;  // oneDNN's implementation, such as "brg:avx512_core_bf16"
  absl::Status refused;  // not ok: the GEMM has no primitive (unimplemented, or its scratchpad refused)
};

std::string Describe(const GemmKey& key) {
  return absl::StrCat(key.operands == dnnl_f32 ? "f32" : "bf16", " GEMM ", key.m, "x", key.n, "x", key.k,
                      key.ta ? " (a transposed)" : "", key.tb ? " (b transposed)" : "");
}

absl::Status Check(dnnl_status_t status, const char* what, const GemmKey& key) {
  if (status == dnnl_success) return absl::OkStatus();
  if (status == dnnl_unimplemented) {
    return absl::UnimplementedError(
        absl::StrCat("oneDNN has no ", what, " for ", Describe(key), " on this CPU"));
  }
  return absl::InternalError(absl::StrCat("oneDNN ", what, " failed (status ", static_cast<int>(status), ") for ",
                                          Describe(key)));
}

dnnl_engine_t Engine() {
  static dnnl_engine_t engine = [] {
    dnnl_engine_t e = nullptr;
    if (dnnl_engine_create(&e, dnnl_cpu, 0) != dnnl_success) return static_cast<dnnl_engine_t>(nullptr);
    return e;
  }();
  return engine;
}

// oneDNN's OpenMP team for calls from this thread: one thread, the calling
// one (libgomp keeps the setting per thread); Strata's pool cuts the work.
void OneOpenMpThread() {
  thread_local const bool once = [] {
    omp_set_num_threads(1);
    return true;
  }();
  (void)once;
}

// Makes the matmul primitive for one GEMM (row-major; a transposed operand
// is the same memory read with swapped strides).
absl::StatusOr<Primitive> Make(const GemmKey& key) {
  dnnl_engine_t engine = Engine();
  if (engine == nullptr) return absl::InternalError("oneDNN has no CPU engine");
  const dnnl_dims_t a_dims = {key.m, key.k}, b_dims = {key.k, key.n}, c_dims = {key.m, key.n};
  const dnnl_dims_t a_strides = {key.ta ? 1 : key.lda, key.ta ? key.lda : 1};
  const dnnl_dims_t b_strides = {key.tb ? 1 : key.ldb, key.tb ? key.ldb : 1};
  const dnnl_dims_t c_strides = {key.ldc, 1};
  dnnl_memory_desc_t a_md, b_md, c_md;
  STRATA_RETURN_IF_ERROR(
      Check(dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, key.operands, a_strides), "a's desc", key));
  STRATA_RETURN_IF_ERROR(
      Check(dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, key.operands, b_strides), "b's desc", key));
  STRATA_RETURN_IF_ERROR(Check(dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_strides), "c's desc", key));
  dnnl_matmul_desc_t desc;
  STRATA_RETURN_IF_ERROR(Check(dnnl_matmul_desc_init(&desc, &a_md, &b_md, nullptr, &c_md), "matmul desc", key));

  dnnl_primitive_attr_t attr = nullptr;
  STRATA_RETURN_IF_ERROR(Check(dnnl_primitive_attr_create(&attr), "attr", key));
  std::unique_ptr<dnnl_primitive_attr, dnnl_status_t (*)(dnnl_primitive_attr_t)> attr_owner(
      attr, dnnl_primitive_attr_destroy);
  STRATA_RETURN_IF_ERROR(
      Check(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad mode", key));
  const float alpha = FloatFromBits(key.alpha_bits), beta = FloatFromBits(key.beta_bits);
  if (alpha != 1.0f) {
    STRATA_RETURN_IF_ERROR(Check(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "alpha", key));
  }
  if (beta != 0.0f) {
    dnnl_post_ops_t post_ops = nullptr;
    STRATA_RETURN_IF_ERROR(Check(dnnl_post_ops_create(&post_ops), "post-ops", key));
    std::unique_ptr<dnnl_post_ops, dnnl_status_t (*)(dnnl_post_ops_t)> post_ops_owner(post_ops,
                                                                                      dnnl_post_ops_destroy);
    STRATA_RETURN_IF_ERROR(Check(dnnl_post_ops_append_sum(post_ops, beta), "beta", key));
    STRATA_RETURN_IF_ERROR(Check(dnnl_primitive_attr_set_post_ops(attr, post_ops), "beta", key));
  }
  dnnl_primitive_desc_t pd = nullptr;
  STRATA_RETURN_IF_ERROR(Check(dnnl_primitive_desc_create(&pd, &desc, attr, engine, nullptr), "matmul", key));
  std::unique_ptr<dnnl_primitive_desc, dnnl_status_t (*)(dnnl_primitive_desc_t)> pd_owner(
      pd, dnnl_primitive_desc_destroy);
  Primitive p;
  const char* impl = nullptr;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl != nullptr) {
    p.impl = impl;
  }
  p.a_md = a_md;
  p.b_md = b_md;
  p.c_md = c_md;
  const dnnl_memory_desc_t* scratch_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  p.scratchpad_bytes = scratch_md == nullptr ? 0 : dnnl_memory_desc_get_size(scratch_md);
  if (scratch_md != nullptr) p.scratchpad_md = *scratch_md;
  const size_t limit = MaxScratchpadBytes().load();
  if (p.scratchpad_bytes > limit) {
    // Memory the plan does not count, kept by the thread: refused, so that
    // a float32 GEMM goes to OpenBLAS, a bf16 one to widened copies (noted).
    return absl::ResourceExhaustedError(absl::StrCat("oneDNN's ", p.impl, " asks a ", p.scratchpad_bytes,
                                                     "-byte scratchpad for ", Describe(key), ", over the ",
                                                     limit, " bytes a thread may keep outside the memory plan"));
  }
  STRATA_RETURN_IF_ERROR(Check(dnnl_primitive_create(&p.primitive, pd), "primitive", key));
  return p;
}

// Every GEMM's primitive, made on first use and kept for the process (a
// program has a handful of shapes).
class PrimitiveCache {
 public:
  absl::StatusOr<const Primitive*> Get(const GemmKey& key) {
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) return Answer(*it->second);
    }
    // Made outside the lock (the JIT takes milliseconds); a race makes two
    // and keeps the first. A refusal is kept too, so a refused GEMM is not
    // made again at every call; any other failure is not.
    absl::StatusOr<Primitive> made = Make(key);
    if (!made.ok() && !absl::IsResourceExhausted(made.status()) && !absl::IsUnimplemented(made.status())) {
      return made.status();
    }
    Primitive entry;
    if (made.ok()) {
      entry = *std::move(made);
    } else {
      entry.refused = made.status();
    }
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = cache_.try_emplace(key, nullptr);
    if (inserted) {
      it->second = std::make_unique<Primitive>(std::move(entry));
    } else if (entry.primitive != nullptr) {
      dnnl_primitive_destroy(entry.primitive);
    }
    return Answer(*it->second);
  }

 private:
  static absl::StatusOr<const Primitive*> Answer(const Primitive& p) {
    if (!p.refused.ok()) return p.refused;
    return &p;
  }
  absl::Mutex mu_;
  absl::flat_hash_map<GemmKey, std::unique_ptr<Primitive>> cache_ ABSL_GUARDED_BY(mu_);
};

PrimitiveCache& Cache() {
  static PrimitiveCache* cache = new PrimitiveCache();
  return *cache;
}

// The GEMM's primitive, on a thread whose oneDNN calls stay on it.
absl::StatusOr<const Primitive*> Lookup(const GemmKey& key) {
  OneOpenMpThread();
  return Cache().Get(key);
}

// This thread's stream and scratchpad (64-byte aligned, grown as needed).
struct ThreadState {
  dnnl_stream_t stream = nullptr;
  void* scratchpad = nullptr;
  size_t scratchpad_bytes = 0;
  ~ThreadState() {
    std::free(scratchpad);
    if (stream != nullptr) dnnl_stream_destroy(stream);
  }
};

absl::Status Execute(const GemmKey& key, const Primitive& p, const void* a, const void* b, void* c) {
  thread_local ThreadState state;
  dnnl_engine_t engine = Engine();
  if (state.stream == nullptr) {
    STRATA_RETURN_IF_ERROR(Check(dnnl_stream_create(&state.stream, engine, dnnl_stream_default_flags), "stream", key));
  }
  if (p.scratchpad_bytes > state.scratchpad_bytes) {
    std::free(state.scratchpad);
    state.scratchpad_bytes = 0;
    const size_t bytes = (p.scratchpad_bytes + 63) / 64 * 64;
    state.scratchpad = std::aligned_alloc(64, bytes);
    if (state.scratchpad == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory allocating oneDNN's ", bytes, " byte scratchpad for ", Describe(key)));
    }
    state.scratchpad_bytes = bytes;
  }
  struct Memory {
    dnnl_memory_t m = nullptr;
    ~Memory() {
      if (m != nullptr) dnnl_memory_destroy(m);
    }
  } am, bm, cm, sm;
  STRATA_RETURN_IF_ERROR(Check(dnnl_memory_create(&am.m, &p.a_md, engine, const_cast<void*>(a)), "a's memory", key));
  STRATA_RETURN_IF_ERROR(Check(dnnl_memory_create(&bm.m, &p.b_md, engine, const_cast<void*>(b)), "b's memory", key));
  STRATA_RETURN_IF_ERROR(Check(dnnl_memory_create(&cm.m, &p.c_md, engine, c), "c's memory", key));
  std::vector<dnnl_exec_arg_t> args = {{DNNL_ARG_SRC, am.m}, {DNNL_ARG_WEIGHTS, bm.m}, {DNNL_ARG_DST, cm.m}};
  if (p.scratchpad_bytes > 0) {
    STRATA_RETURN_IF_ERROR(
        Check(dnnl_memory_create(&sm.m, &p.scratchpad_md, engine, state.scratchpad), "scratchpad memory", key));
    args.push_back({DNNL_ARG_SCRATCHPAD, sm.m});
  }
  STRATA_RETURN_IF_ERROR(Check(dnnl_primitive_execute(p.primitive, state.stream, static_cast<int>(args.size()),
                                                      args.data()),
                               "execute", key));
  return Check(dnnl_stream_wait(state.stream), "wait", key);
}

// Whether oneDNN, on this CPU (its effective ISA: ONEDNN_MAX_CPU_ISA caps
// it), has the instructions the path is worth taking for and makes a JIT
// primitive (not its reference loops) for a GEMM of these operands; asked
// once per type.
bool HasFastKernel(dnnl_data_type_t operands, dnnl_cpu_isa_t isa) {
  const unsigned have = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned need = static_cast<unsigned>(isa);  // the ISAs are feature bit sets
  if ((have & need) != need) return false;
  absl::StatusOr<const Primitive*> p =
      Lookup({operands, false, false, 64, 64, 64, 64, 64, 64, FloatBits(1.0f), FloatBits(0.0f)});
  return p.ok() && (*p)->impl.rfind("ref", 0) != 0;
}

}  // namespace

std::atomic<size_t>& MaxScratchpadBytes() {
  static std::atomic<size_t> limit(kMaxScratchpadBytes);
  return limit;
}

std::atomic<bool>& OnednnBf16Switch() {
  static std::atomic<bool> on(EnvSwitch("STRATA_ONEDNN_BF16", true));
  return on;
}

std::atomic<bool>& OnednnF32Switch() {
  static std::atomic<bool> on(EnvSwitch("STRATA_ONEDNN_F32", true));
  return on;
}

bool NativeBf16Gemm() {
  if (!OnednnBf16Switch().load()) return false;
  // AVX512_BF16 (or AMX): oneDNN's bf16 brgemm, 3-4x OpenBLAS's sgemm here.
  // On AVX-512 without it, oneDNN emulates bf16 (gemm:jit) 1.35x slower
  // than widening to float for OpenBLAS; below AVX-512 it has no bf16
  // matmul at all (unimplemented).
  static const bool fast = HasFastKernel(dnnl_bf16, dnnl_cpu_isa_avx512_core_bf16);
  return fast;
}

bool OnednnF32Gemm() {
  if (!OnednnF32Switch().load()) return false;
  // AVX-512: oneDNN's f32 brgemm, 1.8-2x OpenBLAS 0.3.21's sgemm on this
  // EPYC. On AVX2 its f32 gemm was slower than OpenBLAS's Haswell kernels.
  static const bool fast = HasFastKernel(dnnl_f32, dnnl_cpu_isa_avx512_core);
  return fast;
}

absl::Status OnednnGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bfloat16* a,
                        int64_t lda, const bfloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const GemmKey key{dnnl_bf16, trans_a, trans_b, m, n, k, lda, ldb, ldc, FloatBits(1.0f), FloatBits(beta)};
  STRATA_ASSIGN_OR_RETURN(const Primitive* p, Lookup(key));
  return Execute(key, *p, a, b, c);
}

absl::StatusOr<size_t> OnednnScratchpadBytes(bool f32, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                              int64_t lda, int64_t ldb, int64_t ldc, float alpha, float beta) {
  const dnnl_data_type_t operands = f32 ? dnnl_f32 : dnnl_bf16;
  const GemmKey key{operands, trans_a, trans_b, m, n, k, lda, ldb, ldc, FloatBits(alpha), FloatBits(beta)};
  STRATA_ASSIGN_OR_RETURN(const Primitive* p, Lookup(key));
  return p->scratchpad_bytes;
}

absl::Status OnednnGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                        int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const GemmKey key{dnnl_f32, trans_a, trans_b, m, n, k, lda, ldb, ldc, FloatBits(alpha), FloatBits(beta)};
  STRATA_ASSIGN_OR_RETURN(const Primitive* p, Lookup(key));
  return Execute(key, *p, a, b, c);
}

namespace {

// c = op(a) @ op(b) + beta * c on float copies of the operands' used rows
// (a refused bf16 primitive's way out), through gemm.h's float Gemm.
absl::Status WidenedPanel(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const bfloat16* a, int64_t lda,
                          const bfloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // op(a) is m x k: stored rows of length k (or, transposed, k rows of m).
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  std::vector<float> wa, wb;
  try {
    wa.resize(static_cast<size_t>(a_rows * a_cols));
    wb.resize(static_cast<size_t>(b_rows * b_cols));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory widening a bf16 GEMM ", m, "x", n, "x", k, " to float"));
  }
  for (int64_t i = 0; i < a_rows; ++i) {
    for (int64_t j = 0; j < a_cols; ++j) wa[i * a_cols + j] = ToFloat(a[i * lda + j]);
  }
  for (int64_t i = 0; i < b_rows; ++i) {
    for (int64_t j = 0; j < b_cols; ++j) wb[i * b_cols + j] = ToFloat(b[i * ldb + j]);
  }
  Gemm(ta, tb, m, n, k, 1.0f, wa.data(), a_cols, wb.data(), b_cols, beta, c, ldc);
  return absl::OkStatus();
}

// call(r0, r1, c0, c1) for each of ForEachGemmPanel's panels, the first
// failure returned.
template <typename Call>
absl::Status Panels(int64_t m, int64_t n, int64_t k, const Call& call) {
  FirstFailure first;
  ForEachGemmPanel(m, n, k, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) { first.Note(call(r0, r1, c0, c1)); });
  return first.status();
}

}  // namespace

absl::Status GemmOrScale(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const bfloat16* a, int64_t lda, const bfloat16* b, int64_t ldb, float beta, float* c,
                         int64_t ldc) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {
    ScaleOnly(m, n, beta, c, ldc);
    return absl::OkStatus();
  }
  if (alpha != 1.0f) return absl::InternalError(absl::StrCat("bf16 GEMM with alpha ", alpha, " (only 1 is built)"));
  return Panels(m, n, k, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const bfloat16* pa = trans_a ? a + r0 : a + r0 * lda;
    const bfloat16* pb = trans_b ? b + c0 * ldb : b + c0;
    absl::Status s = OnednnGemm(trans_a, trans_b, r1 - r0, c1 - c0, k, pa, lda, pb, ldb, beta, c + r0 * ldc + c0, ldc);
    if (!absl::IsResourceExhausted(s)) return s;
    // A primitive refused for its scratchpad (Make): this panel runs as the
    // widened kernels run, on float copies of its operands (held only for
    // the call, outside the plan as the scratchpad would have been), and the
    // run says so once.
    NoteCpuKernelFallback(absl::StrCat(s.message(), "; it ran on widened float copies instead"));
    return WidenedPanel(trans_a, trans_b, r1 - r0, c1 - c0, k, pa, lda, pb, ldb, beta, c + r0 * ldc + c0, ldc);
  });
}

}  // namespace strata
