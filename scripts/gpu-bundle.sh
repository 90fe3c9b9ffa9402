#!/usr/bin/env bash
# Packs what scripts/gpu-checks.sh needs on a GPU machine that cannot install or build anything:
# gpupool's binaries, gpu_probe, runc and a static busybox, with every shared library they load
# and this machine's dynamic loader (so they run whatever the other machine's C library is), and a
# busybox root filesystem for the container checks.
#
#   scripts/gpu-bundle.sh [BUILD_DIR] [OUT_DIR]      # defaults: build, gpu-bundle (git-ignored)
#
# The bundle is about 40 MiB; copy (or `carry`) OUT_DIR to the GPU machine beside the checkout.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build=$(cd "${1:-$root/build}" && pwd)
out=${2:-$root/gpu-bundle}
for f in gpupool gpupool-core gpupool-supervise gpu_probe; do
  [ -x "$build/$f" ] || { echo "gpu-bundle: $build/$f is not built" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out/libexec" "$out/lib" "$out/bin"
libs() { { ldd "$1" 2>/dev/null || true; } | { grep -o '/[^ ]*' || true; }; }
pack() {  # FILE: the binary into libexec/, its libraries into lib/, a wrapper into bin/
  local f=$1 name
  name=$(basename "$f")
  cp -L "$f" "$out/libexec/$name"
  strip --strip-debug "$out/libexec/$name" 2>/dev/null || true
  local deps
  deps=$(libs "$f")
  for lib in $deps; do cp -L "$lib" "$out/lib/$(basename "$lib")"; done
  if [ -z "$deps" ]; then  # static: runs as it is
    ln -sf "../libexec/$name" "$out/bin/$name"
  else
    cat > "$out/bin/$name" <<WRAP
#!/bin/sh
b=\$(cd "\$(dirname "\$0")/.." && pwd)
exec "\$b/lib/ld-linux-x86-64.so.2" --library-path "\$b/lib" "\$b/libexec/$name" "\$@"
WRAP
    chmod 0755 "$out/bin/$name"
  fi
}
for f in gpupool-core gpupool-supervise gpu_probe; do pack "$build/$f"; done
# runc re-executes itself (/proc/self/exe) for its init: it runs natively, only its libseccomp
# from the bundle (the GPU machine's own runc is used where it has one).
runc=$(command -v runc || true)
if [ -n "$runc" ]; then
  mkdir -p "$out/lib-runc"
  cp -L "$runc" "$out/libexec/runc"
  for lib in $(libs "$runc"); do
    case "$(basename "$lib")" in libseccomp*) cp -L "$lib" "$out/lib-runc/" ;; esac
  done
  cat > "$out/bin/runc" <<'WRAP'
#!/bin/sh
b=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH="$b/lib-runc" exec "$b/libexec/runc" "$@"
WRAP
  chmod 0755 "$out/bin/runc"
fi
cp /bin/busybox "$out/bin/busybox"
# `gpupool` (the lean client) execs gpupool-core beside it: the bundle's wrapper does instead.
ln -sf gpupool-core "$out/bin/gpupool"
sh "$root/scripts/make-rootfs.sh" "$out/roots/busybox" >/dev/null
echo "gpu-bundle: $out ($(du -sh "$out" | cut -f1))"
