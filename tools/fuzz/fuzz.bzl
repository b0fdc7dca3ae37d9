"""ferry_cc_fuzz_test: a libFuzzer target whose seed corpus also runs as an ordinary test.

For a target `name` this defines:
  name              the fuzzer binary. With `--config=fuzz` (clang-14) it links libFuzzer's main:
                    `bazel-bin/<pkg>/<name> <corpus dir>` fuzzes. Otherwise it links
                    //tools/fuzz:corpus_main and replays the files it is given.
  name_corpus_test  a cc_test that replays every seed file, plus deterministic mutations of each,
                    through LLVMFuzzerTestOneInput (part of `./ferry test`).
`data` holds files the target reads at run time (paths relative to the repository root).
"""

def ferry_cc_fuzz_test(name, srcs, corpus, deps = [], data = []):
    native.cc_library(
        name = name + "_lib",
        testonly = True,
        srcs = srcs,
        deps = deps,
        alwayslink = True,
    )
    native.filegroup(
        name = name + "_corpus",
        testonly = True,
        srcs = corpus,
    )
    native.cc_binary(
        name = name,
        testonly = True,
        data = data,
        deps = [":" + name + "_lib"] + select({
            "//:fuzzing": [],
            "//conditions:default": ["//tools/fuzz:corpus_main"],
        }),
        linkopts = select({
            "//:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = "small",
        args = ["$(locations :%s_corpus)" % name],
        data = [":" + name + "_corpus"] + data,
        deps = [
            ":" + name + "_lib",
            "//tools/fuzz:corpus_main",
        ],
    )
