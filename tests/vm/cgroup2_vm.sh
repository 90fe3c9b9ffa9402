#!/usr/bin/env bash
# The cgroup v2 path, on a real cgroup v2 kernel: this host (and CI's) mounts cpu, memory and pids
# as cgroup v1 hierarchies, so the v2 code of the runtime (DetectCgroups' v2 branch, cpu.max,
# memory.max, pids.max, cgroup.procs, cgroup.kill-free cleanup) never runs here. This boots
# Debian 12's own kernel (linux-image-amd64, fetched with `apt-get download`, not installed) in
# QEMU (emulated; KVM on request) with an initramfs of busybox, the runtime's unit
# tests, gpupool-supervise and runc, mounts cgroup2 at /sys/fs/cgroup with cpu, memory and pids,
# and runs the runtime tests there as root. The tests assert the v2 files (they read which
# hierarchy the task landed in), so a v2 path that wrote nothing fails them.
#
# usage: tests/vm/cgroup2_vm.sh BUILD_DIR [GTEST_FILTER]
# Exit 0 when every selected test passed inside the VM.
set -euo pipefail

build=$(cd "${1:?usage: cgroup2_vm.sh BUILD_DIR [GTEST_FILTER]}" && pwd)
# Less the CUDA limiter's sandbox test: the VM carries neither the limiter library nor a dynamically
# linked program for it to be preloaded into (its tools are the static busybox, which no preload
# reaches); that test runs on the host with the other unit tests.
filter=${2:-'ProcessRuntime.*:Fencing.*:Spawn.*:RuncTest.*:Supervisor.*:SandboxTest.*:RuncSandboxTest.*:CrunSandboxTest.*-SandboxTest.TheCudaLimiterHoldsAProcessTaskThatClearsItsEnvironment'}
say() { echo "cgroup2_vm: $*"; }
fail() { echo "cgroup2_vm: FAIL: $*" >&2; exit 1; }

for tool in qemu-system-x86_64 cpio dpkg-deb apt-get; do
  command -v "$tool" >/dev/null || fail "$tool is missing (scripts/setup.sh installs qemu-system-x86 and cpio)"
done
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || fail "/bin/busybox is not a static busybox (busybox-static)"
for f in runtime_test gpupool-supervise; do [ -x "$build/$f" ] || fail "$build/$f is not built"; done

# The kernel: Debian's current linux-image-amd64, cached beside the build.
cache="$build/vm"
mkdir -p "$cache"
kernel=$(ls "$cache"/vmlinuz-* 2>/dev/null | head -1 || true)
if [ -z "$kernel" ]; then
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
  if [ -z "$pkg" ]; then
    apt-get update -qq
    pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
  fi
  [ -n "$pkg" ] || fail "apt knows no linux-image-amd64"
  say "fetching $pkg (not installed: only its vmlinuz is used)"
  (cd "$cache" && apt-get download -q "$pkg" >/dev/null 2>&1) || { apt-get update -qq; (cd "$cache" && apt-get download -q "$pkg" >/dev/null); }
  deb=$(ls "$cache"/"$pkg"_*.deb | head -1)
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$cache" --wildcards './boot/vmlinuz-*'
  mv "$cache"/boot/vmlinuz-* "$cache"/ && rmdir "$cache/boot" && rm -f "$deb"
  kernel=$(ls "$cache"/vmlinuz-* | head -1)
fi

# The initramfs: busybox, the test binaries with the libraries they link, runc.
root=$(mktemp -d /tmp/gpupool-vm-XXXXXX)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,etc,run,opt/gpupool}
cp /bin/busybox "$root/bin/busybox"
copy_with_libs() {  # FILE DEST_DIR
  cp "$1" "$2/"
  { ldd "$1" 2>/dev/null || true; } | { grep -o '/[^ ]*' || true; } | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    [ -e "$root$lib" ] || cp -L "$lib" "$root$lib"
  done
}
copy_with_libs "$build/runtime_test" "$root/opt/gpupool"
strip --strip-debug "$root/opt/gpupool/runtime_test" 2>/dev/null || true
copy_with_libs "$build/gpupool-supervise" "$root/opt/gpupool"
# coreutils' id: SandboxTest copies it setuid (busybox's applets go by their name)
mkdir -p "$root/usr/bin" && copy_with_libs /usr/bin/id "$root/usr/bin"
runc=$(command -v runc || true)
[ -n "$runc" ] && copy_with_libs "$runc" "$root/usr/sbin"
# crun, which cannot run on this host's cgroup v1 layout: on v2 it can
crun=$(command -v crun || true)
[ -n "$crun" ] && copy_with_libs "$crun" "$root/usr/bin"
# merged /usr, as on the host: /lib64's loader and /lib's libraries
for d in lib lib64; do
  if [ -d "$root/$d" ] && [ ! -L "$root/$d" ]; then mkdir -p "$root/usr/$d" && cp -a "$root/$d/." "$root/usr/$d/" && rm -rf "${root:?}/$d"; fi
  ln -sfn "usr/$d" "$root/$d"
done
echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
echo "nobody:x:65534:65534:nobody:/nonexistent:/bin/false" >> "$root/etc/passwd"
echo "nogroup:x:65534:" >> "$root/etc/group"
# runc needs pivot_root, which the initramfs (rootfs) cannot do: stage 1 copies it into a tmpfs
# and switches root there; stage 2 mounts what a host has and runs the tests.
cat > "$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox mkdir -p /newroot
/bin/busybox mount -t tmpfs -o mode=755 tmpfs /newroot
for e in /*; do
  case "$e" in /proc|/sys|/dev|/newroot) ;; *) /bin/busybox cp -a "$e" /newroot/ ;; esac
done
/bin/busybox mkdir -p /newroot/proc /newroot/sys /newroot/dev
exec /bin/busybox switch_root /newroot /stage2
INIT
cat > "$root/stage2" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up
for i in 0 1 2 3; do [ -e /dev/loop\$i ] || mknod /dev/loop\$i b 7 \$i; done
echo "cgroup2_vm: kernel \$(uname -r); /sys/fs/cgroup: \$(grep ' /sys/fs/cgroup ' /proc/mounts | cut -d' ' -f3), controllers: \$(cat /sys/fs/cgroup/cgroup.controllers)"
cd /opt/gpupool
./runtime_test --gtest_filter='$filter' --gtest_color=no 2>&1
echo "cgroup2_vm: RC=\$?"
poweroff -f
INIT
chmod +x "$root/stage2"
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$cache/initrd.gz"
say "initramfs $(du -h "$cache/initrd.gz" | cut -f1), kernel $(basename "$kernel")"

# Emulated by default: under this project's CI machines (themselves virtual) nested KVM hangs in
# the kernel's early boot; GPUPOOL_VM_ACCEL=kvm uses KVM where it works.
accel=(-accel tcg)
if [ "${GPUPOOL_VM_ACCEL:-}" = kvm ]; then accel=(-accel kvm -cpu host); fi
log="$cache/console.log"
set +e
timeout 600 qemu-system-x86_64 "${accel[@]}" -m 2048 -smp 2 -nographic -no-reboot -nodefaults -serial stdio \
  -kernel "$kernel" -initrd "$cache/initrd.gz" \
  -append "console=ttyS0 panic=-1 quiet rdinit=/init systemd.unified_cgroup_hierarchy=1" > "$log" 2>&1
qrc=$?
set -e
tr -d '\r' < "$log" | grep -v '^\[ *[0-9.]*\]' | sed -n '/^cgroup2_vm: kernel/,$p'
rc=$(tr -d '\r' < "$log" | sed -n 's/^cgroup2_vm: RC=\([0-9]*\)$/\1/p' | tail -1)
[ -n "$rc" ] || fail "the VM did not finish the tests (qemu exit $qrc; console in $log)"
[ "$rc" = 0 ] || fail "runtime tests failed inside the cgroup v2 VM (exit $rc; console in $log)"
# Everything selected is meant to run there (root, runc, crun, busybox, loop devices): a skip is a
# gap in the VM, not a pass.
if tr -d '\r' < "$log" | grep -q '^\[  SKIPPED \]'; then fail "tests skipped inside the VM (console in $log)"; fi
say "OK (${accel[*]})"
