#!/usr/bin/env bash
# Installs every Debian package gpupool's build and tests need. Idempotent: installs only what is
# missing. Run as root (or with sudo available) on Debian 12.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build git
  nlohmann-json3-dev
  libfmt-dev libyaml-cpp-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libsqlite3-dev libcpp-httplib-dev sqlite3 curl python3 python3-yaml
  libboost-dev libssl-dev openssl ccache
  libglpk-dev
  clang libclang-rt-14-dev
  runc busybox-static prometheus
  skopeo umoci crun runsc
  iproute2 iptables
  qemu-system-x86 cpio e2fsprogs mount
  python3-kubernetes libcurl4-openssl-dev
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev python3-grpcio python3-protobuf
)
# kubectl, an independent client of the test Kubernetes API server (tests/kube): Debian's when the
# machine has none of its own.
command -v kubectl >/dev/null 2>&1 || PACKAGES+=(kubernetes-client)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup: need root to install: ${missing[*]}" >&2
    exit 1
  fi
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
