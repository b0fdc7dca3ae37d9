#!/usr/bin/env python3
"""Checks that every dependency points down (design/STYLE.md 23; docs/contributing/layout.md).

Two views of the same rules, both from the repository root:
  - the BUILD graph: every direct dependency (deps, data, srcs of other packages) of every
    target, from `bazel query 'deps(//..., 1)' --output=graph`;
  - the includes: every `#include "pkg/.../file.h"` of every C++ file, as a dependency of the
    file's package on the header's package (what a missing BUILD dependency would hide).

A rule names the packages it holds for (a regular expression over the package path), the
dependencies they may not have (one over the label `//package:target`; for an include, the
target is the header's name without its extension), and whether it holds for tests too (a test
may reach further down than the library it tests: a transport test builds a KV pool on it). A violation is one edge: RULE FROM TO.
tools/testing/layering_allowlist.txt lists the violations known today; the check fails on one
that is not listed, and on a listed one that no longer exists, so the list only shrinks.

Usage: layering_check.py [--bazel BAZEL] [--print]   (--print: list today's violations and exit 0)
"""

import argparse
import os
import re
import subprocess
import sys

# (name, packages it holds for, forbidden dependencies, tests too, why)
RULES = [
    ("engine-knows-no-service", r"^engine(/|$)",
     r"^//(services|kvstore|router|proto|tests)[/:]|^//tools/(sim|load|bench|calibrate|worker_cli)[/:]",
     True, "the engine library sits beneath the service layer and knows no RPC"),
    ("router-reads-only-text-and-formats", r"^router(/|$)",
     r"^//engine/(?!(common|tokenizer|template|gguf)[/:]"
     r"|model/vision:(vision_config|image_placeholders)$"
     r"|grammar:(gbnf_text|json_schema|regex_to_gbnf|integer_range|json_formats|grammar"
     r"|grammar_matcher|gbnf_parser)$)|^//services/(worker|transfer)[/:]",
     True, "the front door links engine/common, tokenizer, template and gguf (and the vision "
     "model's config parse and placeholder expansion, and the grammar texts: GBNF, JSON Schema "
     "and regex lowering, the GBNF parser and matcher; pure functions), never the model, "
     "KV, scheduler, sampling, token masks or backends"),
    ("services-common-is-plumbing", r"^services/common(/|$)",
     r"^//(services/(?!common[/:])|kvstore|router)|^//engine/(?!common[/:])",
     True, "services/common is the process and RPC plumbing beneath every service"),
    ("transfer-moves-bytes", r"^services/transfer(/|$)",
     r"^//(services/(?!(common|transfer)[/:])|kvstore|router)[/:]"
     r"|^//engine/(?!common[/:]|kv:kv_allocator$)",
     False, "the KV transport needs of the engine only engine/common and engine/kv's allocator "
     "seam"),
    ("kvstore-storage-below-services", r"^kvstore$",
     r"^//(services|router)[/:]|^//engine/(?!common[/:])",
     True, "the store's storage library depends on engine/common only"),
    ("kvstore-service-and-client", r"^kvstore/(service|client)(/|$)",
     r"^//(services/worker|router)[/:]|^//engine/(?!common[/:])",
     True, "the store's service and client sit on services/common and services/transfer"),
    ("planner-reads-the-routers-pages", r"^services/planner(/|$)",
     r"^//(router|services/(worker|transfer)|kvstore|proto)[/:]|^//engine/(?!common[/:])"
     r"|^//tools/(sim|load|bench|calibrate|worker_cli)[/:]",
     True, "the planner reads the routers' admin pages over HTTP and shares only pure rules with "
     "the simulator, which sits above it; it links no router, worker or store code"),
    ("vision-is-beneath-the-services", r"^services/vision(/|$)",
     r"^//(services/(?!(common|vision)[/:])|kvstore|router|proto)[/:]",
     True, "services/vision is the image path (bytes -> embedding rows) the worker and the "
     "encoder share: engine and media below it, no service above it"),
    ("media-is-a-leaf", r"^media(/|$)",
     r"^//(engine|services|router|kvstore|proto|tools)[/:]",
     False, "media/ decodes and preprocesses images on Abseil, nlohmann/json, libpng and "
     "libjpeg only, so the router can check image headers without linking the engine"),
]

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
EDGE = re.compile(r'^\s*"([^"]+)"\s*->\s*"([^"]+)"', re.M)
SOURCE_ROOTS = ("engine", "kvstore", "router", "services", "tools", "tests", "proto", "media")


def package_of_label(label):
    m = re.match(r"^@?[^/]*//([^:]*)", label)
    return m.group(1) if m else None


def normalize(label):
    """//a/b:c as is; //a/b -> //a/b:b; external and generated-file labels as they come."""
    if label.startswith("//") and ":" not in label:
        return label + ":" + label.rsplit("/", 1)[-1]
    return label


def query(bazel, expression, *flags):
    run = subprocess.run(
        [bazel, "query", "--noshow_progress", "--ui_event_filters=-info", *flags, expression],
        capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("layering: bazel query %s failed:\n%s" % (expression, run.stderr))
    return run.stdout


def graph_edges(bazel):
    out = query(bazel, "deps(//..., 1)", "--output=graph", "--nograph:factored")
    for src, dst in EDGE.findall(out):
        yield normalize(src), normalize(dst)


def test_targets(bazel):
    """Tests and testonly targets (test helpers, the other process of a process test)."""
    out = query(bazel, "tests(//...) + attr(testonly, 1, //...)")
    return {normalize(line.strip()) for line in out.splitlines() if line.strip()}


def build_dirs(root):
    dirs = set()
    for top in SOURCE_ROOTS:
        for d, _, files in os.walk(os.path.join(root, top)):
            if "BUILD.bazel" in files or "BUILD" in files:
                dirs.add(os.path.relpath(d, root))
    return dirs


def package_of_path(path, packages):
    d = os.path.dirname(path)
    while d and d not in packages:
        d = os.path.dirname(d)
    return d or None


def include_edges(root):
    packages = build_dirs(root)
    for top in SOURCE_ROOTS:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.relpath(os.path.join(d, f), root)
                pkg = package_of_path(path, packages)
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for header in INCLUDE.findall(text):
                    if not header.startswith(tuple(t + "/" for t in SOURCE_ROOTS)):
                        continue
                    hpkg = package_of_path(header, packages)
                    if hpkg is None or hpkg == pkg:
                        continue
                    name = os.path.splitext(os.path.basename(header))[0]
                    yield "//%s:%s" % (pkg, f), "//%s:%s" % (hpkg, name)


def is_test(label, tests):
    return label in tests or re.search(r"_test(_[a-z0-9_]+)?\.cc$", label) is not None


def violations(edges, tests):
    found = set()
    for src, dst in edges:
        spkg = package_of_label(src)
        if spkg is None or not src.startswith("//"):
            continue
        for name, scope, forbidden, tests_too, _ in RULES:
            if not tests_too and is_test(src, tests):
                continue
            if re.search(scope, spkg) and re.search(forbidden, dst):
                found.add((name, src, dst))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bazel", default="bazel")
    parser.add_argument("--print", action="store_true")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.chdir(root)
    found = violations(list(graph_edges(args.bazel)) + list(include_edges(root)),
                       test_targets(args.bazel))
    if args.print:
        for v in sorted(found):
            print(" ".join(v))
        return 0
    allow_path = os.path.join(root, "tools/testing/layering_allowlist.txt")
    allowed = set()
    with open(allow_path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                allowed.add(tuple(line.split()))
    new = sorted(found - allowed)
    gone = sorted(allowed - found)
    why = {rule[0]: rule[-1] for rule in RULES}
    for name, src, dst in new:
        print("layering: %s depends on %s, against rule %s: %s" % (src, dst, name, why[name]))
    for v in gone:
        print("layering: %s is fixed: take it out of tools/testing/layering_allowlist.txt"
              % " ".join(v))
    print("layering: %d dependency rules; %d known violations; %d new; %d fixed"
          % (len(RULES), len(found & allowed), len(new), len(gone)))
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main())
