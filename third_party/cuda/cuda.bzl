"""ferry_cuda_library: compiles .cu files with the toolkit's nvcc into a cc_library.

There are no offline CUDA rules for Bazel 4.2.3, so nvcc runs in genrules: one action per .cu
file (a change to one kernel file recompiles that file alone), each with the library's `hdrs`
and `textual_hdrs` as its inputs. Headers are tracked: after compiling, the action asks nvcc
which files the source included (-M) and fails if any file of this repository among them is not
a declared input, so a header missing from the lists is an error even where the build runs
without a sandbox. Headers a .cu file shares with C++ code must be plain C++ (no absl, gRPC or
protobuf): nvcc never sees those.

Kernels are built for sm_90 (H100/H200) plus compute_90 PTX, with -fmad=false so the GPU does
not fuse a*b+c where the CPU reference does not (kernels that want an FMA call fmaf).

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

# Compiles $(SRC) to $@, then checks the files it included: every relative path (this
# repository's) must be one of the action's declared inputs ($(DECLARED)).
_COMPILE = """
set -euo pipefail
{nvcc} {flags} -c -o $@ {src}
deps=$$({nvcc} {flags} -M {src} | tr -d '\\\\' | tr ' ' '\\n' | sed 's#^\\./##' | sed -n '/^[^/].*\\.\\(h\\|cuh\\|hpp\\|inc\\)$$/p' | sort -u)
declared=" {declared} "
for d in $$deps; do
  case "$$declared" in
    *" $$d "*) ;;
    *) echo "nvcc {src}: includes $$d, which is not in hdrs or textual_hdrs of {name}" >&2; exit 1 ;;
  esac
done
"""

def _header_path(pkg, h):
    # "//a/b:c.h" -> "a/b/c.h"; "c.h" -> "<pkg>/c.h".
    if h.startswith("//"):
        package, _, file = h[2:].partition(":")
        return package + "/" + file
    return (pkg + "/" + h) if pkg else h

def _object_name(name, src):
    return "_objs/%s/%s.o" % (name, src.replace("/", "_").replace(":", "_"))

def ferry_cuda_library(name, srcs, hdrs = [], textual_hdrs = [], deps = [], **kwargs):
    """A cc_library of .cu files, each compiled in its own nvcc action.

    Args:
      name: the cc_library's name.
      srcs: .cu files of this package.
      hdrs: headers others include (plain C++ where C++ code includes them).
      textual_hdrs: headers only the .cu files include (kernels' own .cuh files), and headers of
        other packages they include, as labels ("//engine/common:float_math.h").
      deps: what the library links against.
      **kwargs: passed to the cc_library.
    """
    if not CUDA_AVAILABLE:
        return
    headers = hdrs + textual_hdrs
    pkg = native.package_name()
    declared = " ".join([_header_path(pkg, h) for h in headers])
    objects = []
    for src in srcs:
        out = _object_name(name, src)
        native.genrule(
            name = name + "_nvcc_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + headers,
            outs = [out],
            cmd = _COMPILE.format(
                nvcc = NVCC,
                flags = NVCC_FLAGS,
                src = "$(location %s)" % src,
                declared = declared,
                name = name,
            ),
            message = "nvcc " + src,
        )
        objects.append(out)
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        textual_hdrs = [h for h in textual_hdrs if not h.startswith("//")],
        deps = deps + ["@local_cuda//:cudart_static"],
        alwayslink = True,
        **kwargs
    )
