"""Repository rule that exposes the local CUDA toolkit, or an empty stand-in where there is none.

The toolkit is looked for at $CUDA_PATH, else /usr/local/cuda. When found, @local_cuda has
cc_library targets for the runtime, cuBLAS and NCCL, and defs.bzl says CUDA_AVAILABLE = True
with the path of nvcc. When not found, the same targets exist but are empty, CUDA_AVAILABLE is
False, and packages that hold CUDA code define no CUDA targets (the build says so once).
"""

_BUILD_AVAILABLE = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"]),
    includes = ["include"],
)

# Static runtime: no rpath or LD_LIBRARY_PATH needed where the binary runs.
cc_library(
    name = "cudart_static",
    srcs = ["lib64/libcudart_static.a"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublas",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcublas", "-lcublasLt"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lnccl"],
    deps = [":cuda_headers"],
)
"""

_BUILD_ABSENT = """
package(default_visibility = ["//visibility:public"])

# No CUDA toolkit was found at {path}; these targets are empty so that BUILD files may name them.
cc_library(name = "cuda_headers")

cc_library(name = "cudart_static")

cc_library(name = "cublas")

cc_library(name = "nccl")
"""

def _cuda_configure_impl(ctx):
    cuda_path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(cuda_path + "/bin/nvcc")
    if nvcc.exists:
        real = ctx.path(cuda_path).realpath
        ctx.symlink(str(real) + "/include", "include")
        ctx.symlink(str(real) + "/lib64", "lib64")
        ctx.file("BUILD.bazel", _BUILD_AVAILABLE.replace("{lib}", str(real) + "/lib64"))
        version = ctx.execute([str(nvcc), "--version"]).stdout.strip().split("\n")[-1]
        ctx.file("defs.bzl", "\n".join([
            "CUDA_AVAILABLE = True",
            "CUDA_PATH = %r" % str(real),
            "NVCC = %r" % str(nvcc),
            "CUDA_VERSION = %r" % version,
            "",
        ]))
    else:
        print("CUDA toolkit not found at %s (set CUDA_PATH to use another): " % cuda_path +
              "building without CUDA targets.")
        ctx.file("BUILD.bazel", _BUILD_ABSENT.replace("{path}", cuda_path))
        ctx.file("defs.bzl", "\n".join([
            "CUDA_AVAILABLE = False",
            "CUDA_PATH = None",
            "NVCC = None",
            "CUDA_VERSION = None",
            "",
        ]))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
