#!/usr/bin/env bash
# Build the compose stack's base image from Debian packages alone, for machines that reach no
# container registry: `debootstrap --variant=minbase bookworm` into a directory, then
# `podman import` it as localhost/grid-base:bookworm (the Dockerfile's FROM).
#
#   deploy/podman/base-image.sh            # as root, once; podman keeps it (--force rebuilds)
#
# The root file system holds Python 3.11 with venv, CA certificates (and openssl), libgomp1
# (OpenMP, which the prebuilt llama.cpp of xllamacpp links) and nginx-light
# (the TLS proxy in front of the gateways). The extra CA certificates this machine trusts
# (/usr/local/share/ca-certificates, e.g. an egress proxy's) are trusted inside too, so
# `pip install` in the image build verifies PyPI as the host does.
# Needs root, debootstrap and podman (apt-get install debootstrap podman); CONTAINER_ENGINE=docker
# imports it into Docker instead.
set -euo pipefail

ENGINE="${CONTAINER_ENGINE:-podman}"
IMAGE="${GRID_BASE_IMAGE:-localhost/grid-base:bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3,python3-venv,ca-certificates,libgomp1,nginx-light"

if [[ "${1:-}" != "--force" ]] && "$ENGINE" image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base image $IMAGE exists (--force rebuilds it)"
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "base-image.sh: debootstrap needs root" >&2
    exit 1
fi

root="$(mktemp -d /var/tmp/grid-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT
echo "debootstrap --variant=minbase bookworm from $MIRROR (+ $PACKAGES)"
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || {
    tail -20 "$root.log" >&2
    exit 1
}
rm -f "$root.log"
shopt -s nullglob
extra=(/usr/local/share/ca-certificates/*.crt)
if ((${#extra[@]})); then
    cp "${extra[@]}" "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null
fi
# Nothing runs apt inside the containers: drop the package caches, lists, docs and locales.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/*.log
tar -C "$root" --numeric-owner -c . | "$ENGINE" import --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
echo "built $IMAGE ($("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE") bytes)"
