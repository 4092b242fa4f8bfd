#!/usr/bin/env bash
# scripts/install-deps.sh — installs the Debian packages strata builds and tests with, when they
# are missing. As root it runs apt-get; otherwise it prints the exact apt-get line and stops.
# Called by `make run` and `make test`; safe to run again (does nothing when all are present).
# `--fuzz` adds what scripts/fuzz.sh alone needs: clang 14 with its libFuzzer and sanitizer
# runtimes, and llvm-symbolizer for readable sanitizer stack traces (docs/dependencies.md).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  liburing-dev libtbb-dev libopenmpi-dev openmpi-bin libopenblas-dev
  libgtest-dev libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libxxhash-dev
  xz-utils
)
FUZZ_PACKAGES=(clang-14 libclang-rt-14-dev llvm-14)

case "${1:-}" in
  "") ;;
  --fuzz) PACKAGES+=("${FUZZ_PACKAGES[@]}") ;;
  *) echo "usage: $0 [--fuzz]" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

line="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "strata needs these Debian packages: ${missing[*]}" >&2
  echo "run as root:  apt-get update && $line" >&2
  exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
$line
