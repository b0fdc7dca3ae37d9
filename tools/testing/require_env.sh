# Sourced by shell tests that need the machine's Python virtualenvs or the default model:
#   source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON FERRY_MODEL_GGUF
# Fails the test with a clear message when a named variable does not point at an existing file.
# `./ferry test` sets them all (see .bazelrc --test_env).
for ferry_required_var in "$@"; do
  if [[ -z "${!ferry_required_var:-}" || ! -e "${!ferry_required_var}" ]]; then
    echo "${ferry_required_var} is not set to an existing file; run through './ferry test'" \
         "(or './ferry setup' and export it)." >&2
    exit 1
  fi
done
unset ferry_required_var
