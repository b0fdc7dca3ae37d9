#!/usr/bin/env bash
# A stand-in for ./ferry in local_actuator_test: appends one line to $FERRY_STATE/calls (its
# arguments, FERRY_STATE, the signals blocked when it started, whether descriptor
# $FAKE_LEAKED_FD is open in it, whether it leads its process group), then waits for the test's
# word on the FIFO $FERRY_STATE/go, a line "STATUS MESSAGE", and exits with STATUS after printing
# MESSAGE to stderr as the real script does (coloured). Builtins only before the record: a
# command substitution would change the very mask and descriptors it looks at.
set -u
blocked=""
while read -r key value; do
  [[ "${key}" == SigBlk: ]] && blocked=${value}
done </proc/$$/status
leaked=no
[[ -n "${FAKE_LEAKED_FD:-}" && -e "/proc/$$/fd/${FAKE_LEAKED_FD}" ]] && leaked=yes
read -r _ _ _ _ pgid _ </proc/$$/stat
leader=no
[[ "${pgid}" == "$$" ]] && leader=yes
echo "$* | FERRY_STATE=${FERRY_STATE:-} | blocked=${blocked} | leaked=${leaked} | leader=${leader}" \
  >>"${FERRY_STATE}/calls"
echo "ferry: scale: starting"
read -r code message <"${FERRY_STATE}/go"
printf '\033[1;31mferry: error:\033[0m %s\n' "${message}" >&2
exit "${code}"
