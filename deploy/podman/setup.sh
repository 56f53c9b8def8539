#!/usr/bin/env bash
# Prepare a Debian 12 machine to run docker-compose.yml under podman, as root:
#   - podman, runc and debootstrap from apt;
#   - podman-compose from PyPI (requirements.txt) into the virtual environment VENV (default
#     /opt/grid-podman, linked as /usr/local/bin/podman-compose; .ci/run passes its own);
#   - the base image localhost/grid-base:bookworm (base-image.sh; kept once built).
#
#   deploy/podman/setup.sh [VENV]
#   . deploy/podman/env.sh    # then podman reads deploy/podman/containers.conf
#
# Exit status 3 means this machine cannot run containers this way (not root, no apt-get, the
# package mirror unreachable); the reason is on stderr. Any other failure is a real one.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
VENV="${1:-/opt/grid-podman}"

unavailable() {
    echo "deploy/podman/setup.sh: $*" >&2
    exit 3
}

[[ "$(id -u)" == 0 ]] || unavailable "needs root (apt-get install podman runc debootstrap; debootstrap for the base image)"
command -v apt-get >/dev/null || unavailable "no apt-get here: install podman, runc and debootstrap by other means"
missing=()
for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
    echo "apt-get install podman runc debootstrap (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    log="$(mktemp)"
    apt-get update -q >"$log" 2>&1 || { tail -5 "$log" >&2; unavailable "apt-get update failed (no package mirror?)"; }
    apt-get install -y -q podman runc debootstrap >"$log" 2>&1 || {
        tail -10 "$log" >&2
        unavailable "apt-get install podman runc debootstrap failed"
    }
    rm -f "$log"
fi
podman --version

if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt"
"$VENV/bin/podman-compose" --version | head -1
if [[ "$VENV" == /opt/grid-podman ]]; then
    # On PATH ahead of /usr/bin, where Debian's podman-compose 1.0.3 may be.
    ln -sf "$VENV/bin/podman-compose" /usr/local/bin/podman-compose
fi

export CONTAINERS_CONF="$here/containers.conf"
bash "$here/base-image.sh"
