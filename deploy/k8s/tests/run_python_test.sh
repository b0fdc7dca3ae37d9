#!/usr/bin/env bash
# Runs one of deploy/k8s's Python checks with the deploy virtualenv (tools/python/
# requirements-deploy.txt: kubernetes-validate, jsonschema, PyYAML), which `./ferry setup`
# creates and `./ferry test` names in FERRY_DEPLOY_PYTHON.
#   run_python_test.sh SCRIPT [ARGS...]
set -euo pipefail
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_DEPLOY_PYTHON
exec "${FERRY_DEPLOY_PYTHON}" "$@"
