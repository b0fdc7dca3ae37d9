#!/bin/sh
# Bazel's --workspace_status_command (.bazelrc): what the binaries' --version reports.
# STABLE_ keys: a change rebuilds the one stamped file (services/common:build_info) and relinks.
# Outside a git checkout (a source tarball) the commit is "unknown".
commit=$(git rev-parse HEAD 2>/dev/null) || commit=unknown
if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi
echo "STABLE_FERRY_GIT_COMMIT $commit"
