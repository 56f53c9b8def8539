# Source this before podman / podman-compose on a VM like the CI machine:
#   . deploy/podman/env.sh
# It points podman at deploy/podman/containers.conf (runc, cgroupfs, a nofile limit) instead of
# editing /etc/containers/containers.conf.
export CONTAINERS_CONF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/containers.conf"
