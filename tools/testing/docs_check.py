#!/usr/bin/env python3
"""Checks the manual (README.md and docs/): what it links to and the commands it shows exist.

  - Every Markdown link [text](target) in README.md and docs/**.md: a relative target resolves to
    a file or directory of the repository (never outside it), and a #fragment names a heading of
    the Markdown file it points to (GitHub's anchors). Links out of the repository fail: the
    manual is read where the code is. http(s) URLs are allowed only for localhost.
  - Every `./ferry COMMAND` the manual shows (in code, inline or in blocks) is a command of the
    ./ferry script; `./ferry bench NAME` a benchmark of tools/bench/benchmarks; `./ferry models
    SUB` one of its subcommands; and each `--flag` of `./ferry up` one that `up` takes.
  - Every Prometheus series a service defines (a "ferry_..." string literal in the C++ sources,
    comments aside, less tests, fuzzers, benchmarks and testing helpers) is listed in
    docs/operations/metrics.md; and every metric name the manual shows is one of them (or a
    histogram's _bucket, _sum or _count of one, or a prefix ending in "_" of one): on that page
    every ferry_ name in code, elsewhere every name of a service's family (ferry_router_...,
    ferry_worker_..., ferry_kvstore_..., ferry_kv_transfer..., ferry_planner_..., ferry_build_...,
    ferry_process_...).
    A literal that is only a piece of a name ("ferry_worker_" + ...) fails too: a name built from
    parts is one this check cannot see, so the source writes every name whole.

Usage: docs_check.py   (from anywhere; exit 1 with one line per problem)
"""

import os
import re
import sys

LINK = re.compile(r"(?<!\!)\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"\!\[([^\]]*)\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`]+)`")
FERRY_COMMAND = re.compile(r"\./ferry\s+([a-z][a-z-]*)((?:\s+[^\s`|;&)]+)*)")


def markdown_files(root):
    files = [os.path.join(root, "README.md")]
    for d, _, names in os.walk(os.path.join(root, "docs")):
        files += [os.path.join(d, n) for n in sorted(names) if n.endswith(".md")]
    return [f for f in files if os.path.isfile(f)]


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    s = heading.strip().lower()
    s = re.sub(r"[`*_]", "", s)
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found = set()
        counts = {}
        in_code = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.lstrip().startswith("```"):
                    in_code = not in_code
                    continue
                m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m and not in_code:
                    a = slug(m.group(1))
                    n = counts.get(a, 0)
                    counts[a] = n + 1
                    found.add(a if n == 0 else "%s-%d" % (a, n))
        cache[path] = found
    return cache[path]


def strip_code_blocks(text):
    """The text with fenced code blocks blanked (links inside code are not links)."""
    out, in_code = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            out.append("")
            continue
        out.append("" if in_code else line)
    return "\n".join(out)


def check_links(root, path, text, problems):
    rel = os.path.relpath(path, root)
    prose = strip_code_blocks(text)
    prose = CODE_SPAN.sub("", prose)
    for lineno, line in enumerate(prose.split("\n"), 1):
        for m in list(LINK.finditer(line)) + list(IMAGE.finditer(line)):
            target = m.group(2)
            where = "%s:%d: [%s](%s)" % (rel, lineno, m.group(1), target)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                if not re.match(r"^https?://(localhost|127\.0\.0\.1)([:/]|$)", target):
                    problems.append("%s: a link out of the repository" % where)
                continue
            file_part, _, fragment = target.partition("#")
            if file_part:
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            else:
                resolved = path
            if os.path.relpath(resolved, root).startswith(".."):
                problems.append("%s: points outside the repository" % where)
                continue
            if not os.path.exists(resolved):
                problems.append("%s: no such file" % where)
                continue
            if fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
                problems.append("%s: no heading #%s in %s"
                                % (where, fragment, os.path.relpath(resolved, root)))


def ferry_facts(root):
    with open(os.path.join(root, "ferry"), encoding="utf-8") as f:
        script = f.read()
    main = script[script.index("\nmain() {"):]
    commands = set(re.findall(r"^\s+([a-z][a-z-]*(?: \| [a-z-]+)*)\)", main, re.M))
    commands = {c.strip() for group in commands for c in group.split("|")}
    models = script[script.index("cmd_models() {"):]
    models = models[:models.index("\n}\n")]
    model_subcommands = set(re.findall(r"^\s+([a-z]+)\)", models, re.M))
    up = script[script.index("up_parse() {"):]
    up = up[:up.index("\n}\n")]
    up_flags = set(re.findall(r"(--[a-z][a-z-]*)", up))
    benches = set()
    with open(os.path.join(root, "tools/bench/benchmarks"), encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                benches.add(line.split()[0])
    return commands, model_subcommands, up_flags, benches


def check_commands(root, path, text, facts, problems):
    rel = os.path.relpath(path, root)
    commands, model_subcommands, up_flags, benches = facts
    for lineno, line in enumerate(text.split("\n"), 1):
        for m in FERRY_COMMAND.finditer(line):
            command, rest = m.group(1), m.group(2).split()
            where = "%s:%d: ./ferry %s" % (rel, lineno, " ".join([command] + rest)[:60])
            if command not in commands:
                problems.append("%s: ./ferry has no command %r" % (where, command))
                continue
            args = [a for a in rest if not a.startswith("-")]
            if command == "bench" and args and re.match(r"^[a-z][a-z0-9_-]*$", args[0]) \
                    and args[0] not in benches:
                problems.append("%s: no benchmark %r in tools/bench/benchmarks" % (where, args[0]))
            if command == "models" and args and args[0] not in model_subcommands:
                problems.append("%s: ./ferry models has no %r" % (where, args[0]))
            if command == "up":
                for a in rest:
                    flag = a.split("=", 1)[0]
                    if flag.startswith("--") and flag not in up_flags:
                        problems.append("%s: ./ferry up takes no %s" % (where, flag))


METRIC = re.compile(r'"(ferry_[a-z0-9_]*[a-z0-9])"')
METRIC_PIECE = re.compile(r'"(ferry_[a-z0-9_]*)"')
METRICS_PAGE = "docs/operations/metrics.md"
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
# A metric name in the manual's text, outside the metrics page: one of the services' families.
METRIC_IN_MANUAL = re.compile(
    r"\bferry_(?:router|worker|kvstore|kv_transfers?|planner|build|process)_[a-z0-9_]*")


def strip_cc_comments(text):
    """C++ source with its // and /* */ comments blanked, string and character literals kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        raw = re.match(r'R"([^()\\ ]{0,16})\(', text[i - 1:i + 19]) if c == '"' and i else None
        if raw:  # R"delim( ... )delim"
            j = text.find(")%s\"" % raw.group(1), i)
            j = n if j < 0 else j + len(raw.group(1)) + 2
            out.append(text[i:j])
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            out.append("\n" * text.count("\n", i, n if j < 0 else j))
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def metric_sources(root):
    """(path, text without comments) of every C++ file whose metrics the page must list."""
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs
                         if not x.startswith((".", "bazel-")) and x not in ("third_party", "testing"))
        if os.path.relpath(d, root).startswith(os.path.join("tools", "bench")):
            continue
        for n in sorted(names):
            if not n.endswith((".cc", ".h")) or n.endswith(("_test.cc", "_fuzz.cc")):
                continue
            path = os.path.join(d, n)
            with open(path, encoding="utf-8", errors="replace") as f:
                yield path, strip_cc_comments(f.read())


def check_metrics(root, files, problems):
    page = os.path.join(root, METRICS_PAGE)
    if not os.path.isfile(page):
        problems.append("%s: missing" % METRICS_PAGE)
        return
    with open(page, encoding="utf-8") as f:
        text = f.read()
    listed = set(re.findall(r"`(ferry_[a-z0-9_]+)`", text))
    defined = set()
    for path, source in metric_sources(root):
        rel = os.path.relpath(path, root)
        names = set(METRIC.findall(source))
        defined |= names
        for metric in sorted(names - listed):
            problems.append("%s: %s is not in %s" % (rel, metric, METRICS_PAGE))
        for piece in sorted(m for m in set(METRIC_PIECE.findall(source)) if m.endswith("_")):
            problems.append("%s: \"%s\" is a piece of a metric name: write each name whole, so "
                            "that %s can be checked against it" % (rel, piece, METRICS_PAGE))
    # What the manual shows: a defined series, one of a histogram's, or a prefix of one.
    for path in files:
        with open(path, encoding="utf-8") as f:
            shown = set(METRIC_IN_MANUAL.findall(f.read()))
        if os.path.samefile(path, page):
            for span in CODE_SPAN.findall(strip_code_blocks(text)):
                shown |= set(re.findall(r"\bferry_[a-z0-9_]+", span))
        for name in sorted(shown - defined):
            if name.endswith(HISTOGRAM_SERIES) and name.rsplit("_", 1)[0] in defined:
                continue
            if name.endswith("_") and any(d.startswith(name) for d in defined):
                continue
            problems.append("%s: %s is defined by no source (a series renamed or gone?)"
                            % (os.path.relpath(path, root), name))


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    facts = ferry_facts(root)
    problems = []
    files = markdown_files(root)
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        check_links(root, path, text, problems)
        check_commands(root, path, text, facts, problems)
    check_metrics(root, files, problems)
    for p in problems:
        print("docs: " + p)
    print("docs: %d files; %d problems" % (len(files), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
