#!/usr/bin/env bash
# Ferry's container images, built without a registry (issue 45; `./ferry image build`).
#
#   build_images.sh --router BIN --worker BIN --kvstore BIN [--kv BIN] [--planner BIN]
#                   [--encoder BIN] [--cache DIR] [--prune] [--save DIR]
#
# One image per binary family: ferry-router, ferry-worker (every role), ferry-kvstore (with the
# `ferry-kv` tool) and, given --planner, ferry-planner (deploy/k8s/components/planner), given
# --encoder, ferry-encoder (deploy/k8s/components/encoder), each tagged
# ferry-<family>:<version>-<commit> (both from the binary's --version: the VERSION file and the
# commit Bazel stamped) and :latest. The model is not in any
# image: the pods mount it (deploy/k8s).
#
# The root filesystem is Debian bookworm made by mmdebstrap from Debian's archive, holding only
# the packages that own the shared libraries `ldd` names for the binaries (dpkg -S on this
# machine, Debian 12 too), their dependencies, and base-files: no shell scripts run, no compiler,
# no Python (checked). Variant `extract`: the packages' files without their maintainer scripts.
# `custom` would run them, which needs dpkg and a shell in the image, and libucx0's dependency
# libibverbs1 pulls adduser, whose scripts need perl: the minbase set again. For shared libraries
# the scripts only run ldconfig, which runs here from the host (`ldconfig -r`); a dpkg status file
# lists the packages for image scanners. The tarball is cached in CACHE/image/ under a hash of the
# package list and the mmdebstrap options, so a machine makes it once; `docker import` makes it the
# image ferry-base:<hash> (skipped when the daemon has it), and `docker build` with the legacy
# builder (no BuildKit here) adds the binary, a non-root user (uid 65532) and the ENTRYPOINT.
# Every image is then checked: its dynamic loader resolves every library of its binaries (and of
# UCX's transport modules, which it dlopens), and `BINARY --version` runs in it as uid 65532.
#
# The Docker client is Debian's /usr/bin/docker (FERRY_DOCKER overrides; another `docker` may come
# first on the PATH) against the daemon of $DOCKER_HOST (its default when unset).
#   --cache DIR   where the root filesystem tarballs live (default ${FERRY_CACHE}/image)
#   --prune       remove the older tags of the images' repositories and dangling images
#   --save DIR    also write each image as DIR/ferry-<family>.tar (`docker save`: for
#                 `kind load image-archive`, `ctr images import`, `docker load`)
# Prints one line per image: "ferry-<family>:<tag> <size in MB> MB".
set -euo pipefail

die() {
  echo "build_images.sh: error: $*" >&2
  exit 1
}
log() { echo "build_images.sh: $*" >&2; }

router="" worker="" kvstore="" kv="" planner="" encoder="" cache="${FERRY_CACHE:-/var/cache/ferry}/image" prune=0 save=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --router) router=$2; shift 2 ;;
    --worker) worker=$2; shift 2 ;;
    --kvstore) kvstore=$2; shift 2 ;;
    --kv) kv=$2; shift 2 ;;
    --planner) planner=$2; shift 2 ;;
    --encoder) encoder=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    --prune) prune=1; shift ;;
    --save) save=$2; shift 2 ;;
    *) die "unknown argument '$1' (see the header of $0)" ;;
  esac
done
for b in "${router}" "${worker}" "${kvstore}" ${kv:+"${kv}"} ${planner:+"${planner}"} \
         ${encoder:+"${encoder}"}; do
  [[ -n "${b}" ]] || die "--router, --worker and --kvstore are required"
  [[ -x "${b}" ]] || die "not an executable file: ${b}"
done
DOCKER=${FERRY_DOCKER:-/usr/bin/docker}
[[ -x "${DOCKER}" ]] || die "${DOCKER} missing: install Debian's docker.io (./ferry setup)"
command -v mmdebstrap >/dev/null || die "mmdebstrap missing: install it (./ferry setup)"
export DOCKER_BUILDKIT=0

# --- Version and commit, from the router binary ------------------------------------------------
version_out=$("${router}" --version)
version=$(awk 'NR == 1 {print $2}' <<<"${version_out}")
commit=$(awk '$1 == "commit:" {print $2}' <<<"${version_out}")
[[ -n "${version}" && -n "${commit}" ]] || die "cannot read the version from: ${version_out}"
short=${commit:0:12}
[[ "${commit}" != *-dirty ]] || short="${short}-dirty"
tag="${version}-${short}"

# --- The packages: whoever owns each library ldd names -----------------------------------------
libs=$(for b in "${router}" "${worker}" "${kvstore}" ${kv:+"${kv}"} ${planner:+"${planner}"} \
                ${encoder:+"${encoder}"}; do
         ldd "${b}" || die "ldd ${b} failed"
       done | awk '/not found/ {print "MISSING " $1; next}
                   $2 == "=>" && $3 ~ /^\// {print $3; next}
                   $1 ~ /^\// {print $1}' | sort -u)
if grep -q '^MISSING' <<<"${libs}"; then
  die "libraries not found on this machine: $(grep '^MISSING' <<<"${libs}" | cut -d' ' -f2 | xargs)"
fi
# Merged /usr: dpkg knows a library by the path its package ships (/lib/... or /usr/lib/...), ldd
# names it by the loader's path, and either may be a symlink: ask for every spelling at once.
spellings() {
  local path real
  while read -r path; do
    real=$(readlink -f "${path}")
    printf '%s %s\n' "${path}" "${path}" "${path}" "${real}"
    printf '%s %s\n' "${path}" "${path#/usr}" "${path}" "/usr${path}" "${path}" "${real#/usr}" \
      "${path}" "/usr${real}"
  done
}
candidates=$(spellings <<<"${libs}" | awk '$2 ~ /^\// && !seen[$0]++')
owners=$(dpkg -S $(awk '{print $2}' <<<"${candidates}" | sort -u) 2>/dev/null || true)
packages=(base-files)
while read -r lib; do
  pkg=$(awk -v lib="${lib}" 'NR == FNR { if ($1 == lib) want[$2] = 1; next }
                             { p = $1; sub(/:.*/, "", p); if ($2 in want) { print p; exit } }' \
        <(echo "${candidates}") <(echo "${owners}"))
  [[ -n "${pkg}" ]] ||
    die "no Debian package ships ${lib} (dpkg -S): the image must be made of Debian's packages only"
  packages+=("${pkg}")
done <<<"${libs}"
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)

# --- The root filesystem (cached) ----------------------------------------------------------------
MIRRORS=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)
# After extraction (customize hooks do not run in the extract variant): the ld.so cache, a dpkg
# status file of what was extracted (for scanners), and no documentation but the copyright files.
EXTRACTED='set -e
ldconfig -r "$1"
mkdir -p "$1/var/lib/dpkg"
: > "$1/var/lib/dpkg/status"
for deb in "$1"/var/cache/apt/archives/*.deb; do
  dpkg-deb -f "$deb" | sed "/^Package:/a Status: install ok installed" >> "$1/var/lib/dpkg/status"
  echo >> "$1/var/lib/dpkg/status"
done
find "$1/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
rm -rf "$1/usr/share/man" "$1/usr/share/info" "$1/usr/share/locale" "$1/usr/share/lintian"'
MMDEBSTRAP_OPTS=(--variant=extract --format=tar --quiet
                 "--include=$(IFS=,; echo "${packages[*]}")"
                 "--extract-hook=${EXTRACTED}")
key=$( (printf '%s\n' "${MMDEBSTRAP_OPTS[@]}" "${MIRRORS[@]}"; mmdebstrap --version) |
       sha256sum | cut -c1-16)
rootfs="${cache}/rootfs-${key}.tar"
mkdir -p "${cache}"
if [[ ! -f "${rootfs}" ]]; then
  log "mmdebstrap: Debian bookworm with ${#packages[@]} packages: ${packages[*]}"
  tmp="${cache}/.rootfs-${key}.$$.tar"
  trap 'rm -f "${tmp}"' EXIT
  mmdebstrap "${MMDEBSTRAP_OPTS[@]}" bookworm "${tmp}" "${MIRRORS[@]}" ||
    die "mmdebstrap failed (it needs Debian's archive: ${MIRRORS[0]})"
  mv "${tmp}" "${rootfs}"
  trap - EXIT
  # Older root filesystems (another package list) are of no use now.
  find "${cache}" -maxdepth 1 -name 'rootfs-*.tar' ! -name "rootfs-${key}.tar" -delete
fi
listing=$(tar -tf "${rootfs}")
tools='(python[0-9.]*|(x86_64-linux-gnu-)?(gcc|g\+\+|cpp|cc|c\+\+|clang(\+\+)?|ld|as)(-[0-9.]+)?)'
forbidden=$(grep -E "^\./usr/(local/)?bin/${tools}\$|^\./usr/lib/(python3|gcc)/" <<<"${listing}" |
            head -n 5 || true)
[[ -z "${forbidden}" ]] || die "the root filesystem holds a compiler or Python: ${forbidden}"

base="ferry-base:${key}"
if ! "${DOCKER}" image inspect "${base}" >/dev/null 2>&1; then
  log "docker import ${rootfs} ${base}"
  "${DOCKER}" import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --message "Debian bookworm: ${packages[*]}" "${rootfs}" "${base}" >/dev/null
fi

# --- One image per family ------------------------------------------------------------------------
context=$(mktemp -d)
trap 'rm -rf "${context}"' EXIT
printf '%s\n' 'root:x:0:0:root:/root:/usr/sbin/nologin' \
  'ferry:x:65532:65532:ferry:/nonexistent:/usr/sbin/nologin' >"${context}/passwd"
printf 'root:x:0:\nferry:x:65532:\n' >"${context}/group"
# UCX's transport modules (dlopened, so ldd of the binaries misses them): checked in the images
# of the binaries that load UCX (the worker's and the store's; not the router's, the planner's or
# the encoder's).
ucx_modules=$(grep -E '^\./usr/lib/x86_64-linux-gnu/ucx/lib[a-z_]+\.so\.[0-9]+$' <<<"${listing}" |
              sed 's/^\.//' || true)

build_family() {  # build_family FAMILY ENTRYPOINT_BINARY [MORE_BINARIES...]
  local family=$1 main=$2
  shift 2
  local dir="${context}/${family}" image="ferry-${family}"
  mkdir -p "${dir}"
  cp "${context}/passwd" "${context}/group" "${dir}/"
  local name copies=() b
  for b in "${main}" "$@"; do
    name=$(basename "${b}")
    cp "${b}" "${dir}/${name}"
    chmod 0555 "${dir}/${name}"
    copies+=("${name}")
  done
  name=$(basename "${main}")
  cat >"${dir}/Dockerfile" <<EOF
FROM ${base}
COPY passwd group /etc/
COPY ${copies[*]} /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/${name}"]
LABEL org.opencontainers.image.title="${image}" \\
      org.opencontainers.image.version="${version}" \\
      org.opencontainers.image.revision="${commit}" \\
      org.opencontainers.image.base.name="debian:bookworm (mmdebstrap ${key})"
EOF
  "${DOCKER}" build -q -t "${image}:${tag}" -t "${image}:latest" "${dir}" >/dev/null ||
    die "docker build of ${image} failed"
  # Every library of every binary (and UCX module) resolves in the image, and the binary runs;
  # checked once per image id (the content's hash), which a warm rebuild keeps.
  local id target out
  id=$("${DOCKER}" image inspect -f '{{.Id}}' "${image}:${tag}")
  id=${id#sha256:}
  if [[ -f "${cache}/checked/${id}" ]]; then
    report "${image}"
    return
  fi
  for target in "${copies[@]/#//usr/local/bin/}" ${ucx_modules}; do
    [[ "${target}" != */ucx/* ]] || [[ "${family}" == worker || "${family}" == kvstore ]] ||
      continue
    out=$("${DOCKER}" run --rm --network none --entrypoint /lib64/ld-linux-x86-64.so.2 \
          "${image}:${tag}" --list "${target}" 2>&1) ||
      die "${image}: ld.so --list ${target}: ${out}"
    ! grep -q 'not found' <<<"${out}" ||
      die "${image}: libraries of ${target} missing: $(grep 'not found' <<<"${out}" | xargs)"
  done
  out=$("${DOCKER}" run --rm --network none --read-only --cap-drop ALL "${image}:${tag}" \
        --version 2>&1) || die "${image}: --version failed: ${out}"
  grep -q "${commit}" <<<"${out}" ||
    die "${image}: --version says ${out}, expected commit ${commit}"
  mkdir -p "${cache}/checked"
  touch "${cache}/checked/${id}"
  report "${image}"
}

report() {  # report IMAGE: its line, then --save and --prune
  local image=$1 size
  size=$("${DOCKER}" image inspect -f '{{.Size}}' "${image}:${tag}")
  echo "${image}:${tag} $((size / 1000000)) MB"
  if [[ -n "${save}" ]]; then
    mkdir -p "${save}"
    "${DOCKER}" save -o "${save}/${image}.tar" "${image}:${tag}" "${image}:latest"
  fi
  if [[ ${prune} -eq 1 ]]; then
    local old
    for old in $("${DOCKER}" image ls --format '{{.Repository}}:{{.Tag}}' "${image}"); do
      [[ "${old}" == "${image}:${tag}" || "${old}" == "${image}:latest" ]] ||
        "${DOCKER}" rmi "${old}" >/dev/null
    done
  fi
}

build_family router "${router}"
build_family worker "${worker}"
build_family kvstore "${kvstore}" ${kv:+"${kv}"}
[[ -z "${planner}" ]] || build_family planner "${planner}"
[[ -z "${encoder}" ]] || build_family encoder "${encoder}"
if [[ ${prune} -eq 1 ]]; then
  for old in $("${DOCKER}" image ls --format '{{.Repository}}:{{.Tag}}' ferry-base); do
    [[ "${old}" == "${base}" ]] || "${DOCKER}" rmi "${old}" >/dev/null
  done
  "${DOCKER}" image prune -f >/dev/null
fi
