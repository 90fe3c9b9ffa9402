#!/bin/sh
# Builds a minimal busybox root filesystem for the runc runtime: make-rootfs.sh DIR
# DIR must not exist yet or be empty. Needs a static busybox (Debian: busybox-static), looked up
# at $BUSYBOX, /bin/busybox or on PATH.
set -eu

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
dir=$1

busybox=${BUSYBOX:-}
if [ -z "$busybox" ]; then
  if [ -x /bin/busybox ]; then
    busybox=/bin/busybox
  else
    busybox=$(command -v busybox || true)
  fi
fi
if [ -z "$busybox" ] || [ ! -x "$busybox" ]; then
  echo "$0: busybox not found (install busybox-static or set BUSYBOX)" >&2
  exit 1
fi
if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
  echo "$0: $dir exists and is not empty" >&2
  exit 1
fi

mkdir -p "$dir"
for d in bin proc dev sys tmp etc; do
  mkdir -p "$dir/$d"
done
chmod 1777 "$dir/tmp"
cp "$busybox" "$dir/bin/busybox"
chmod 0755 "$dir/bin/busybox"
for tool in sh echo sleep env cat id true ls; do
  ln -s busybox "$dir/bin/$tool"
done
# Names for uid/gid 0, so `id` prints them.
printf 'root:x:0:0:root:/:/bin/sh\n' > "$dir/etc/passwd"
printf 'root:x:0:\n' > "$dir/etc/group"
echo "$dir"
