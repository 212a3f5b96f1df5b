#!/usr/bin/env bash
# Build Tolk's image and run it for real (.ci/run calls this; see docs/deploy.md, "What is tested").
#
# No Docker engine is needed: podman and runc from Debian's packages build the Dockerfile on a Debian bookworm base
# made here with debootstrap (minbase plus python3, python3-venv and ca-certificates), imported once and kept as
# localhost/tolk-base:bookworm for the next run. The build sees this machine's pip configuration (its indexes,
# wheel directories, constraints and certificates, mounted read-only), so it installs what `make setup` installs
# here, the pinned CPU torch included. Then deploy/check_image.py starts the image and checks it: /ready, the
# translations against this checkout's engine, a stream, /metrics, the non-root user, the HEALTHCHECK command, and a
# clean stop on SIGTERM with a request in flight. The image and container are removed afterwards; the base stays.
#
# When this machine cannot run containers (no podman and no way to install it, no root, a runtime that will not
# start), the script says so plainly and exits 0, unless TOLK_IMAGE_TEST=required, which makes that a failure.
#
#   bash deploy/test-image.sh            # PYTHON (default .venv/bin/python) runs the checks
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
BASE=localhost/tolk-base:bookworm
# This run's own tag and container name: a second run on the machine (another clone's CI) never meets them.
IMAGE=localhost/tolk:image-test-$$
NAME=tolk-image-check-$$
start=$SECONDS

cannot() {
    echo "test-image: this machine cannot build or run the image: $*" >&2
    if [ "${TOLK_IMAGE_TEST:-}" = required ]; then exit 1; fi
    echo "test-image: SKIPPED (set TOLK_IMAGE_TEST=required to make this a failure)" >&2
    exit 0
}

missing=""
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || missing="$missing $tool"; done
if [ -n "$missing" ]; then
    [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null || cannot "missing$missing, and not root with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086  # one word per package
    { apt-get update -qq && apt-get install -y -qq $missing >/dev/null; } || cannot "installing$missing failed"
fi
[ "$(id -u)" -eq 0 ] || cannot "podman runs here as root only (rootless needs subuid ranges this script does not set up)"

work=$(mktemp -d)
# Sandboxes often refuse to raise RLIMIT_NOFILE/NPROC, which podman does for every container by default.
printf '[containers]\ndefault_ulimits = []\n' > "$work/containers.conf"
export CONTAINERS_CONF="$work/containers.conf"
# runc and cgroupfs: no systemd needed (crun and the systemd cgroup manager are the defaults elsewhere)
podman=(podman --runtime runc --cgroup-manager cgroupfs --events-backend file)
cleanup() {
    "${podman[@]}" rm --force --time 0 "$NAME" >/dev/null 2>&1 || true
    "${podman[@]}" rmi --force "$IMAGE" >/dev/null 2>&1 || true
    "${podman[@]}" image prune --force >/dev/null 2>&1 || true  # the build's intermediate images
    rm -rf "$work"
}
trap cleanup EXIT

"${podman[@]}" info >"$work/info.log" 2>&1 || cannot "podman info failed: $(tail -3 "$work/info.log")"

if ! "${podman[@]}" image exists "$BASE"; then
    # The Debian mirror this machine's apt uses (deb822 or one-line sources), else debootstrap's default.
    mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p; s/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\) .*/\2/p' \
        /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | grep -v security | head -1 || true)
    echo "test-image: making the bookworm base with debootstrap"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$work/root" \
        ${mirror:+"$mirror"} >"$work/debootstrap.log" 2>&1 \
        || cannot "debootstrap failed: $(tail -3 "$work/debootstrap.log")"
    tar -C "$work/root" -c . | "${podman[@]}" import - "$BASE" >/dev/null
    rm -rf "$work/root"
fi

# This machine's pip configuration as one file for the build, and the local paths it names, mounted read-only.
mounts=()
while IFS= read -r path; do mounts+=(--volume "$path:$path:ro"); done < <(
    "$PYTHON" - "$work/pip.conf" <<'EOF'
import os, subprocess, sys
settings = {}
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
for line in listed.splitlines():  # later sources override earlier ones, as pip reads them
    key, _, value = line.partition("=")
    settings[key.split(".", 1)[1]] = value.strip("'\"")
with open(sys.argv[1], "w") as f:
    f.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))
paths = {w.removeprefix("file://") for v in settings.values() for w in v.split()}
for p in sorted(p for p in paths if p.startswith("/") and os.path.exists(p)):
    print(os.path.dirname(p) if p.endswith("/simple") else p)
EOF
)
mounts+=(--volume "$work/pip.conf:/etc/pip.conf:ro")

echo "test-image: building $IMAGE"
build_start=$SECONDS
# --format docker keeps the HEALTHCHECK (the OCI format has no field for it); the host network reaches the indexes.
"${podman[@]}" build --format docker --network host --build-arg BASE_IMAGE="$BASE" "${mounts[@]}" \
    --tag "$IMAGE" . >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; echo "test-image: build FAILED"; exit 1; }
echo "test-image: built in $((SECONDS - build_start)) s ($("${podman[@]}" image inspect "$IMAGE" --format '{{.Size}}' \
    | awk '{printf "%.0f MB", $1 / 1e6}'))"
# What the build said of the kernels it compiled ahead (the Dockerfile's build-kernels step); the whole log is kept
# where TOLK_IMAGE_BUILD_LOG says
[ -z "${TOLK_IMAGE_BUILD_LOG:-}" ] || cp "$work/build.log" "$TOLK_IMAGE_BUILD_LOG"
grep -E "kernels compiled ahead into|^(kernels not compiled|no C compiler|tolk build-kernels)" "$work/build.log" \
    | sed 's/^/test-image: /' || echo "test-image: the build said nothing of the kernels compiled ahead"

"$PYTHON" deploy/check_image.py --podman "${podman[*]}" --image "$IMAGE" --name "$NAME"
echo "test-image: done in $((SECONDS - start)) s"
