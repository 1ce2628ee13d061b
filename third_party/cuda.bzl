"""Finds the CUDA toolkit (CUDA_PATH, default /usr/local/cuda).

Writes @local_cuda//:defs.bzl with HAS_CUDA and CUDA_PATH, and a `cuda`
cc_library with headers and link flags when the toolkit is present.
"""

def _local_cuda_impl(ctx):
    cuda_path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    # Everything the CUDA targets compile and link against; a partial
    # install (say, no cuDNN) means a CPU-only build, not a broken one.
    required = [
        "bin/nvcc",
        "include/cuda_runtime.h",
        "include/cublasLt.h",
        "include/cudnn.h",
        "include/nccl.h",
        "lib64/libcudart_static.a",
        "lib64/libcublasLt.so",
        "lib64/libcublas.so",
        "lib64/libcudnn.so",
        "lib64/libnccl.so",
    ]
    missing = [f for f in required if not ctx.path(cuda_path + "/" + f).exists]
    has_cuda = not missing
    if missing and ctx.path(cuda_path).exists:
        print("CUDA at %s lacks %s: CPU-only build" % (cuda_path, ", ".join(missing)))
    ctx.file("WORKSPACE", "")
    ctx.file("defs.bzl", "HAS_CUDA = %s\nCUDA_PATH = %r\n" % (has_cuda, cuda_path))
    if not has_cuda:
        ctx.file("BUILD", "")
        return
    ctx.symlink(cuda_path + "/include", "include")
    lib = cuda_path + "/lib64"
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "cuda",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"], allow_empty = True),
    includes = ["include"],
    linkopts = [
        "-L{lib}", "-Wl,-rpath,{lib}",
        "-lcudart_static", "-ldl", "-lrt", "-lpthread",
        "-lcublasLt", "-lcublas", "-lcudnn", "-lnccl",
    ],
)
""".format(lib = lib))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
