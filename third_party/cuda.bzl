"""Finds the CUDA toolkit (CUDA_PATH, default /usr/local/cuda).

Writes @local_cuda//:defs.bzl with HAS_CUDA and CUDA_PATH, and a `cuda`
cc_library with headers and link flags when the toolkit is present.
"""

def _local_cuda_impl(ctx):
    cuda_path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(cuda_path + "/bin/nvcc")
    has_cuda = nvcc.exists and ctx.path(cuda_path + "/include/cuda_runtime.h").exists
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
