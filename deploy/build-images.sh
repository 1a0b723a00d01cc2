#!/usr/bin/env bash
# Builds the serving image on a machine that reaches package registries but not Docker Hub or
# download.pytorch.org. `deploy/build-images.sh --help` says how; docs/deployment.md says when.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: deploy/build-images.sh [--base-image IMAGE] [--ca-bundle FILE] [--torch-wheel FILE] [--target STAGE]
                              [--tag TAG]

Builds the Dockerfile's serving image with its sources set for a machine that reaches only package
registries:
  - torch's CPU wheel goes into wheelhouse/, which the Dockerfile searches first: from --torch-wheel, or as
    this machine's pip downloads it (`pip download --no-deps torch==VERSION`, VERSION as pyproject.toml pins
    it; point pip at an index with the CPU build, e.g. PIP_EXTRA_INDEX_URL, if PyPI's CUDA build comes);
  - BASE_IMAGE is --base-image, e.g. one built by deploy/build-base-image.sh;
  - CA_BUNDLE is --ca-bundle, copied into the build context (deploy/image/local-ca.pem);
  - PIP_INDEX_URL and PIP_EXTRA_INDEX_URL are passed on when set in the environment.
With internet access, neither script is needed: `docker compose build` or
`docker build --target serve -t attnserve:cpu .` uses Docker Hub and download.pytorch.org.

  sudo deploy/build-base-image.sh --ca-bundle /etc/ssl/certs/ca-certificates.crt
  deploy/build-images.sh --base-image attnserve-base:bookworm
  docker compose up --exit-code-from loadtest      # uses the image built: attnserve:cpu

Options:
  --base-image IMAGE  the CPU stages' base (default: the Dockerfile's, python:3.11-slim)
  --ca-bundle FILE    PEM certificates every stage trusts (a base image from build-base-image.sh trusts its own)
  --torch-wheel FILE  torch's CPU wheel, copied into wheelhouse/
  --target STAGE      the Dockerfile stage to build (default: serve; serve-gpu for CUDA)
  --tag TAG           the image's name (default: attnserve:cpu, as docker-compose.yml names it;
                      attnserve:gpu for serve-gpu)
  -h, --help          this text
EOF
}

die() { echo "build-images.sh: $*" >&2; exit 2; }
need_value() { [ -n "${2:-}" ] || die "$1 needs a value (see --help)"; }

repo="$(cd "$(dirname "$0")/.." && pwd)"
base_image=""
ca_bundle=""
torch_wheel=""
target=serve
tag=""
while [ $# -gt 0 ]; do
    case "$1" in
        --base-image) need_value "$@"; base_image="$2"; shift 2 ;;
        --ca-bundle) need_value "$@"; ca_bundle="$2"; shift 2 ;;
        --torch-wheel) need_value "$@"; torch_wheel="$2"; shift 2 ;;
        --target) need_value "$@"; target="$2"; shift 2 ;;
        --tag) need_value "$@"; tag="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
case "$target" in
    serve) tag="${tag:-attnserve:cpu}" ;;
    serve-gpu) tag="${tag:-attnserve:gpu}" ;;
    *) die "--target $target: not a serving stage (serve or serve-gpu)" ;;
esac
command -v docker >/dev/null || die "docker is not installed"
docker info >/dev/null 2>&1 || die "the Docker daemon does not answer (is dockerd running, may this user use it?)"
cd "$repo"

# torch's version, from the one place it is pinned.
torch_version="$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"' | cut -d= -f3)"
[ -n "$torch_version" ] || die "pyproject.toml pins no torch==VERSION"
if [ -n "$torch_wheel" ]; then
    [ -r "$torch_wheel" ] || die "--torch-wheel $torch_wheel: not a readable file"
    cp "$torch_wheel" wheelhouse/
fi
if ! ls wheelhouse/torch-"$torch_version"*.whl >/dev/null 2>&1; then
    echo "== pip download torch==$torch_version into wheelhouse/"
    "${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary :all: --dest wheelhouse "torch==$torch_version"
fi
for wheel in wheelhouse/torch-*.whl; do
    case "$(basename "$wheel")" in
        "torch-$torch_version+cpu-"*) ;;
        *) die "$wheel is not the CPU build of torch $torch_version (torch-$torch_version+cpu-*.whl): remove it, and" \
               "pass --torch-wheel or point pip at an index with the CPU build" ;;
    esac
done

args=(--target "$target" --tag "$tag")
[ -z "$base_image" ] || args+=(--build-arg "BASE_IMAGE=$base_image")
if [ -n "$ca_bundle" ]; then
    grep -q -- "-----BEGIN CERTIFICATE-----" "$ca_bundle" 2>/dev/null \
        || die "--ca-bundle $ca_bundle: not a readable file with a PEM certificate"
    cp "$ca_bundle" deploy/image/local-ca.pem
    args+=(--build-arg CA_BUNDLE=deploy/image/local-ca.pem)
fi
for name in PIP_INDEX_URL PIP_EXTRA_INDEX_URL; do
    [ -z "${!name:-}" ] || args+=(--build-arg "$name=${!name}")
done
# Without buildx the docker CLI falls back to the classic builder, which this Dockerfile is written for.
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0

echo "== docker build ${args[*]} ."
docker build "${args[@]}" .
echo "built $tag"
