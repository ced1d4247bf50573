#!/usr/bin/env bash
# Installs from Debian's packages what the real node and the image tests need (as root, once per
# machine): dockerd (the images are built with it), containerd and runc (the kubelet runs pods
# through them; docker.io brings both; the built images are loaded into containerd with ctr),
# debootstrap (the images' base: no registry is reachable) and iptables (kube-proxy). Does nothing when
# they are there.
set -euo pipefail
need=()
for pair in dockerd:docker.io containerd:containerd runc:runc ctr:containerd debootstrap:debootstrap iptables:iptables; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "${pair%%:*}" >/dev/null 2>&1 \
        || need+=("${pair#*:}")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "error: the real node's packages are missing (${need[*]}): run as root: apt-get install ${need[*]}" >&2
    exit 1
fi
echo "installing ${need[*]} from Debian's packages..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q --no-install-recommends "${need[@]}" >&2
