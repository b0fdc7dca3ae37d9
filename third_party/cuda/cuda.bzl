"""ferry_cuda_library: compiles .cu files with the toolkit's nvcc into a static library.

There are no offline CUDA rules for Bazel 4.2.3, so nvcc runs in a genrule. It has no header
tracking: list every header a .cu file includes in `hdrs` (they are inputs of the genrule).
Kernels are built for sm_90 (H100/H200) plus compute_90 PTX, with -fmad=false so the GPU does
not fuse a*b+c where the CPU reference does not (determinism behind a flag later builds on it).

Where the toolkit is absent (@local_cuda's CUDA_AVAILABLE is False) the macro defines nothing;
packages guard their CUDA binaries and tests with CUDA_AVAILABLE too.
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "NVCC")

NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O2",
    "-fmad=false",
    "-Xcompiler -fPIC",
    "-I.",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
])

def ferry_cuda_library(name, srcs, hdrs = [], deps = [], **kwargs):
    if not CUDA_AVAILABLE:
        return
    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs,
        outs = ["lib" + name + "_cuda.a"],
        cmd = "{nvcc} {flags} -lib -o $@ {srcs}".format(
            nvcc = NVCC,
            flags = NVCC_FLAGS,
            srcs = " ".join(["$(location %s)" % s for s in srcs]),
        ),
        message = "nvcc " + name,
    )
    native.cc_library(
        name = name,
        srcs = ["lib" + name + "_cuda.a"],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart_static"],
        alwayslink = True,
        **kwargs
    )
