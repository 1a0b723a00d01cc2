#!/usr/bin/env bash
# Builds a Python base image from a Debian archive, without Docker Hub: debootstrap + `docker import`.
# `deploy/build-base-image.sh --help` says how; docs/deployment.md says when.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: deploy/build-base-image.sh [--tag TAG] [--mirror URL] [--security-mirror URL|none] [--suite SUITE]
                                  [--ca-bundle FILE] [--if-missing]

Builds a minimal Debian image with python3 and python3-venv (Debian bookworm: Python 3.11) from a Debian
archive with debootstrap, and loads it into Docker with `docker import`. Use it as the Dockerfile's
BASE_IMAGE where Docker Hub (python:3.11-slim) cannot be reached, e.g. behind a corporate proxy or from
internal mirrors only:

  sudo deploy/build-base-image.sh --ca-bundle /etc/ssl/certs/ca-certificates.crt
  deploy/build-images.sh --base-image attnserve-base:bookworm

Options:
  --tag TAG              the image's name (default: attnserve-base:bookworm)
  --mirror URL           the Debian archive (default: http://deb.debian.org/debian)
  --security-mirror URL  Debian's security archive, whose updates are applied (default:
                         http://deb.debian.org/debian-security); `none` skips them
  --suite SUITE          the Debian release (default: bookworm)
  --ca-bundle FILE       PEM certificates to trust inside the image, e.g. your proxy's CA, so that apt and
                         pip reach https mirrors through it (the image keeps Debian's CAs too)
  --if-missing           do nothing when TAG already exists
  -h, --help             this text

Needs root (debootstrap), debootstrap (Debian/Ubuntu: apt-get install debootstrap), docker, and about 400 MB
in a temporary folder ($TMPDIR). Takes 2 to 5 minutes, mostly downloads.
EOF
}

die() { echo "build-base-image.sh: $*" >&2; exit 2; }
need_value() { [ -n "${2:-}" ] || die "$1 needs a value (see --help)"; }

tag=attnserve-base:bookworm
mirror=http://deb.debian.org/debian
security_mirror=http://deb.debian.org/debian-security
suite=bookworm
ca_bundle=""
if_missing=false
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) need_value "$@"; tag="$2"; shift 2 ;;
        --mirror) need_value "$@"; mirror="$2"; shift 2 ;;
        --security-mirror) need_value "$@"; security_mirror="$2"; shift 2 ;;
        --suite) need_value "$@"; suite="$2"; shift 2 ;;
        --ca-bundle) need_value "$@"; ca_bundle="$2"; shift 2 ;;
        --if-missing) if_missing=true; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

command -v docker >/dev/null || die "docker is not installed"
docker info >/dev/null 2>&1 || die "the Docker daemon does not answer (is dockerd running, may this user use it?)"
if $if_missing && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "build-base-image.sh: $tag exists; kept (--if-missing)"
    exit 0
fi
[ "$(id -u)" -eq 0 ] || die "debootstrap needs root: run it with sudo"
command -v debootstrap >/dev/null || die "debootstrap is not installed (Debian/Ubuntu: apt-get install debootstrap)"
if [ -n "$ca_bundle" ]; then
    [ -r "$ca_bundle" ] || die "--ca-bundle $ca_bundle: not a readable file"
    grep -q -- "-----BEGIN CERTIFICATE-----" "$ca_bundle" || die "--ca-bundle $ca_bundle: no PEM certificate in it"
fi

root="$(mktemp -d "${TMPDIR:-/tmp}/attnserve-base.XXXXXX")"
chmod 755 "$root"  # apt downloads as the _apt user, who must reach the root file system
cleanup() { rm -rf --one-file-system "$root"; }
trap cleanup EXIT

in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"; }

echo "== debootstrap $suite from $mirror"
# minbase: dpkg, apt and the essential packages; python3-venv brings ensurepip's wheels, which a venv
# needs because Debian's own Python refuses `pip install` into the system (PEP 668).
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$suite" "$root" "$mirror"

if [ -n "$ca_bundle" ]; then
    echo "== trusting $ca_bundle"
    # A .crt under /usr/local/share/ca-certificates joins /etc/ssl/certs/ca-certificates.crt, the bundle that
    # OpenSSL, apt and Debian's pip read.
    cp "$ca_bundle" "$root/usr/local/share/ca-certificates/attnserve-extra.crt"
    in_root update-ca-certificates
fi

# The archives this image installs from later, updates included.
{
    echo "deb $mirror $suite main"
    echo "deb $mirror $suite-updates main"
    [ "$security_mirror" = none ] || echo "deb $security_mirror $suite-security main"
} > "$root/etc/apt/sources.list"
if [ "$security_mirror" != none ]; then
    echo "== security updates from $security_mirror"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    in_root apt-get update -q
    in_root apt-get upgrade -y -q
fi

# What a container gets from Docker at run time (resolv.conf, hostname) or must not share (machine-id).
in_root apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/* "$root"/tmp/* \
    "$root/etc/resolv.conf" "$root/etc/hostname"
: > "$root/etc/machine-id"

echo "== docker import $tag"
tar --numeric-owner -C "$root" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    --message "debootstrap --variant=minbase $suite from $mirror (deploy/build-base-image.sh)" \
    - "$tag" >/dev/null
python="$(docker run --rm "$tag" python3 --version)"
echo "built $tag: Debian $suite, $python"
