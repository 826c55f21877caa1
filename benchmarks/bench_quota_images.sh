#!/bin/bash
# What a per-session file system with a size and an inode limit would cost (docs/security.md,
# "The disk"): a sparse ext4 image with an inode cap, made, loop-mounted and unmounted, N times.
#
#     sudo benchmarks/bench_quota_images.sh [N] [SIZE_MIB] [INODES]
#
# Needs root, mkfs.ext4 and loop devices. Also says whether ext4 project quotas mount here
# (the kernel needs CONFIG_QUOTA and CONFIG_QFMT_V2). Leaves nothing behind.
set -euo pipefail
n=${1:-5}
size=${2:-2048}
inodes=${3:-100000}
dir=$(mktemp -d /tmp/km-quota-images-XXXXXX)
trap 'umount "$dir"/m* 2>/dev/null || true; rm -rf "$dir"' EXIT
ms() { echo $(( ($2 - $1) / 1000000 )); }
echo "image ${size} MiB, ${inodes} inodes, ${n} times (load: $(cut -d' ' -f1-3 /proc/loadavg))"
for i in $(seq 1 "$n"); do
  img="$dir/s$i.img" mnt="$dir/m$i"
  mkdir -p "$mnt"
  t0=$(date +%s%N)
  truncate -s "${size}M" "$img"
  mkfs.ext4 -q -F -N "$inodes" -m 0 -O ^has_journal,^resize_inode -E lazy_itable_init=1,nodiscard "$img"
  t1=$(date +%s%N)
  mount -o loop,nodev,nosuid "$img" "$mnt"
  t2=$(date +%s%N)
  umount "$mnt"
  t3=$(date +%s%N)
  echo "mkfs $(ms "$t0" "$t1") ms  mount $(ms "$t1" "$t2") ms  umount $(ms "$t2" "$t3") ms  on disk $(du -k "$img" | cut -f1) KiB"
  rm -f "$img"
done
truncate -s 64M "$dir/q.img"
mkfs.ext4 -q -F -O quota,project -E quotatype=prjquota "$dir/q.img" 2>/dev/null || true
mkdir -p "$dir/mq"
if mount -o loop,prjquota "$dir/q.img" "$dir/mq" 2>/dev/null; then
  echo "ext4 project quotas: mount here"
  umount "$dir/mq"
else
  echo "ext4 project quotas: do not mount here ($(dmesg 2>/dev/null | grep -o 'kernel was not built with.*' | tail -1))"
fi
