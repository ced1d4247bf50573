#!/usr/bin/env bash
# A Debian bookworm image with Python 3, pip and venv from Debian's packages, made with debootstrap (as
# root), for machines that cannot pull the Dockerfiles' public base:
#     make images BASE=$(dev/base_image.sh)
# The image is named after this script's contents, so a changed recipe makes a new one; nothing is done
# when it exists. Prints its name. DEBIAN_MIRROR overrides the mirror (default: the one apt uses here).
set -euo pipefail
engine=${CONTAINER_ENGINE:-$(command -v docker || command -v podman || true)}
[ -n "$engine" ] || { echo "error: neither docker nor podman is installed" >&2; exit 1; }
name=largebatch-base:bookworm-$(sha256sum "$0" | cut -c1-12)
if "$engine" image inspect "$name" >/dev/null 2>&1; then echo "$name"; exit 0; fi
command -v debootstrap >/dev/null || { echo "error: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

apt_mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
    awk '/^URIs:/ || /^deb / {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/ && $i !~ /security/) {print $i; exit}}' || true)
mirror=${DEBIAN_MIRROR:-${apt_mirror:-http://deb.debian.org/debian}}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "making $name with debootstrap from $mirror..." >&2
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
    bookworm "$work/rootfs" "$mirror" >&2
root=$work/rootfs
# The Dockerfiles pip-install as root into the image's own Python, as they do on python:3.12-slim.
rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
# Certificate authorities this machine adds (a proxy in front of PyPI, say) are trusted inside too:
# a build does not see the host's pip settings.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >&2
fi
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/* "$root"/var/log/*
tar -C "$root" -c . | "$engine" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$name" >&2
echo "$name"
