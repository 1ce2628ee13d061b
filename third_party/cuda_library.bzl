"""CUDA targets: nvcc-compiled libraries, binaries and tests.

Every macro here defines nothing when the CUDA repository rule found no
toolkit (HAS_CUDA is False), so a BUILD file can call them unconditionally and
a machine without CUDA still gets a green CPU-only build.

    load("//third_party:cuda_library.bzl", "cuda_library", "cuda_test")
    cuda_library(name = "relu", srcs = ["relu.cu"], hdrs = ["relu.h"])
    cuda_test(name = "relu_test", srcs = ["relu_test.cc"], deps = [":relu"])
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@local_cuda//:defs.bzl", "CUDA_PATH", "HAS_CUDA")

# sm_80 (A100) and sm_90 (H100/H200) SASS; no PTX, so no JIT at start-up.
CUDA_ARCH_FLAGS = [
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=sm_90",
]

_NVCC_FLAGS = ["-O2", "-std=c++17", "-Xcompiler", "-fPIC", "-DNDEBUG"] + CUDA_ARCH_FLAGS

def _nvcc_object_impl(ctx):
    src = ctx.file.src
    out = ctx.outputs.out
    cc_toolchain = find_cpp_toolchain(ctx)

    # Include paths and headers of the deps, as the C++ compile would see
    # them: the workspace root and generated files (proto headers) come in as
    # quote includes of every target.
    contexts = [dep[CcInfo].compilation_context for dep in ctx.attr.deps]
    headers = depset(ctx.files.hdrs, transitive = [c.headers for c in contexts])
    args = ctx.actions.args()
    args.add("-ccbin", cc_toolchain.compiler_executable)
    args.add_all(_NVCC_FLAGS)
    args.add_all(ctx.attr.copts)
    args.add("-I.")
    args.add("-I" + ctx.genfiles_dir.path)
    args.add("-I" + ctx.bin_dir.path)
    for c in contexts:
        # nvcc has no -iquote; -I serves "" includes just as well.
        args.add_all(c.quote_includes, format_each = "-I%s")
        args.add_all(c.includes, format_each = "-I%s")
        args.add_all(c.system_includes, before_each = "-isystem")
        args.add_all(c.defines, format_each = "-D%s")
    args.add("-c", src)
    args.add("-o", out)
    ctx.actions.run(
        executable = ctx.attr.nvcc,
        arguments = [args],
        inputs = depset([src], transitive = [headers, cc_toolchain.all_files]),
        outputs = [out],
        mnemonic = "Nvcc",
        progress_message = "nvcc %s" % src.short_path,
        use_default_shell_env = True,  # the usual PATH, as a genrule would have
    )
    return [DefaultInfo(files = depset([out]))]

_nvcc_object = rule(
    implementation = _nvcc_object_impl,
    attrs = {
        "src": attr.label(allow_single_file = [".cu"], mandatory = True),
        "out": attr.output(mandatory = True),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "nvcc": attr.string(mandatory = True),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    fragments = ["cpp"],
)

def cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], nvcc_copts = [], **kwargs):
    """A cc_library of nvcc-compiled .cu files plus plain C++ host sources.

    Each .cu in srcs becomes one nvcc object (sm_80 and sm_90, -fPIC); other
    srcs compile with the C++ toolchain against the CUDA headers. The library
    links cudart statically plus cuBLAS/cuBLASLt, cuDNN and NCCL
    (@local_cuda//:cuda). Defines nothing without a CUDA toolkit.

    Args:
      name: the cc_library's name.
      srcs: .cu files (nvcc) and .cc/.h files (C++ toolchain).
      hdrs: public headers; plain C++ (CUDA runtime types are fine).
      deps: cc_library deps; their headers and include paths reach nvcc too.
      copts: copts of the C++ sources.
      nvcc_copts: extra nvcc flags for the .cu files.
      **kwargs: passed to the cc_library (visibility, tags, ...).
    """
    if not HAS_CUDA:
        return
    objects = []
    host_srcs = []
    for src in srcs:
        if not src.endswith(".cu"):
            host_srcs.append(src)
            continue
        base = src[:-len(".cu")]
        obj_rule = "%s_%s_nvcc" % (name, base.replace("/", "_"))
        _nvcc_object(
            name = obj_rule,
            src = src,
            out = "_objs/%s/%s.cu.o" % (name, base),  # .cu.o: no clash with a same-named .cc
            hdrs = hdrs + [s for s in srcs if s.endswith(".h") or s.endswith(".cuh")],
            deps = deps + ["@local_cuda//:cuda"],
            copts = nvcc_copts,
            nvcc = CUDA_PATH + "/bin/nvcc",
            tags = kwargs.get("tags", []),
            testonly = kwargs.get("testonly", False),
        )
        objects.append(":" + obj_rule)
    native.cc_library(
        name = name,
        srcs = host_srcs + objects,
        hdrs = hdrs,
        copts = copts,
        deps = deps + ["@local_cuda//:cuda"],
        # A shared library of nvcc objects with static cudart fails at run
        # time (undefined __cudaPopCallConfiguration); link them statically.
        linkstatic = True,
        **kwargs
    )

def cuda_binary(name, deps = [], **kwargs):
    """A cc_binary over CUDA libraries; defines nothing without a CUDA toolkit."""
    if not HAS_CUDA:
        return
    native.cc_binary(name = name, deps = deps + ["@local_cuda//:cuda"], **kwargs)

def cuda_sh_test(name, **kwargs):
    """An sh_test over CUDA binaries (their data); defines nothing without a CUDA toolkit."""
    if not HAS_CUDA:
        return
    native.sh_test(name = name, **kwargs)

def cuda_test(name, deps = [], tags = [], needs_gpu = True, **kwargs):
    """A cc_test over CUDA libraries; defines nothing without a CUDA toolkit.

    Tagged `gpu` unless needs_gpu is False (a test that only needs the
    toolkit's libraries, e.g. version queries), so CPU-only CI filters it out
    with --test_tag_filters=-gpu. Linked statically so the binary bundles
    onto a GPU machine with few shared libraries (tools/device-bundle).
    """
    if not HAS_CUDA:
        return
    native.cc_test(
        name = name,
        deps = deps + ["@local_cuda//:cuda"],
        tags = tags + (["gpu"] if needs_gpu else []),
        linkstatic = True,
        **kwargs
    )
