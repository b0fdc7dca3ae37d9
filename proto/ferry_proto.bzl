"""ferry_cc_proto: C++ (and gRPC) code from a .proto file with the system protoc.

Debian ships protoc and grpc_cpp_plugin but no Bazel proto rules that work offline, so a genrule
runs them. The .proto path is relative to the calling package, which is the import root:
`ferry_cc_proto(name = "common_proto", src = "ferry/v1/common.proto")` in //proto generates
"ferry/v1/common.pb.h", included as such by dependents.
"""

PROTOC = "/usr/bin/protoc"
GRPC_PLUGIN = "/usr/bin/grpc_cpp_plugin"

def ferry_cc_proto(name, src, deps = [], imports = [], grpc = False, **kwargs):
    """Generates <src>.pb.{h,cc} (and .grpc.pb.{h,cc} when grpc = True) and a cc_library.

    Args:
      name: the cc_library's name.
      src: the .proto file, relative to this package (the import root).
      deps: ferry_cc_proto targets whose messages `src` imports.
      imports: the .proto files `src` imports (protoc must see them), relative to this package.
      grpc: whether to generate gRPC service stubs.
      **kwargs: passed to the cc_library (visibility, testonly).
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    grpc_flags = ""
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
        grpc_flags = "--grpc_out=$(GENDIR)/{pkg} --plugin=protoc-gen-grpc={plugin} ".format(
            pkg = native.package_name(),
            plugin = GRPC_PLUGIN,
        )
    pkg = native.package_name() or "."
    native.genrule(
        name = name + "_gen",
        srcs = [src] + imports,
        outs = outs,
        cmd = ("{protoc} -I{pkg} --cpp_out=$(GENDIR)/{pkg} {grpc_flags}" +
               "{pkg}/{src}").format(
            protoc = PROTOC,
            pkg = pkg,
            grpc_flags = grpc_flags,
            src = src,
        ),
        testonly = kwargs.get("testonly", False),
    )
    system_deps = ["//third_party/system:protobuf"]
    if grpc:
        system_deps.append("//third_party/system:grpcpp")
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = ["."],
        copts = ["-Wno-unused-parameter"],
        deps = deps + system_deps,
        **kwargs
    )
