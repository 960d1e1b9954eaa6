#!/usr/bin/env bash
# Build the tiny local base image the container tests run replicas in.
#
# Why: the project's machines reach no public image registry, so the tests cannot pull
# python:3.11-slim. Debian's debootstrap makes a minimal bookworm root (python3 is 3.11)
# from the machine's package mirror instead. The rootfs tarball is cached under
# $POLLUX_TEST_BASE_CACHE (default /var/cache/pollux-test-base) so a re-run, or a fresh
# podman storage, only needs the ~5 s `podman import`, not the ~2 min debootstrap.
#
# Usage: scripts/build_test_base_image.sh [IMAGE]   (default localhost/pollux-test-base:bookworm)
# Needs root, podman and debootstrap (apt-get install -y podman runc debootstrap).
set -euo pipefail

IMAGE="${1:-${POLLUX_TEST_BASE_IMAGE:-localhost/pollux-test-base:bookworm}}"
CACHE="${POLLUX_TEST_BASE_CACHE:-/var/cache/pollux-test-base}"
TARBALL="$CACHE/rootfs.tar"
SUITE="${POLLUX_TEST_BASE_SUITE:-bookworm}"
MIRROR="${POLLUX_TEST_BASE_MIRROR:-http://deb.debian.org/debian}"

if podman image exists "$IMAGE"; then
    echo "base image $IMAGE already present"
    exit 0
fi

if [[ ! -s "$TARBALL" ]]; then
    command -v debootstrap >/dev/null || {
        echo "debootstrap is not installed: apt-get install -y debootstrap" >&2
        exit 1
    }
    mkdir -p "$CACHE"
    ROOTFS="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
    trap 'rm -rf "$ROOTFS"' EXIT
    echo "debootstrap $SUITE into $ROOTFS (about 2 minutes, cached afterwards)"
    debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOTFS" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 || {
        echo "debootstrap failed; see $CACHE/debootstrap.log" >&2
        exit 1
    }
    # Drop what a test replica never needs: apt lists and docs keep the tarball small.
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
    tar -C "$ROOTFS" -cf "$TARBALL.tmp" .
    mv "$TARBALL.tmp" "$TARBALL"
fi

podman import "$TARBALL" "$IMAGE" >/dev/null
echo "imported $IMAGE from $TARBALL"
