#!/usr/bin/env bash
# A target restart seen through a mounted file system: netdam-target serves a file namespace,
# `netdam nbd --reconnect-timeout` exports it, nbdfuse + losetup + mount put ext4 on it, and a
# small file workload (write a file, fsync it, record its checksum, in a loop) runs while the
# target is killed with SIGKILL and started again on the same port and data directory. Passes
# when the workload saw no I/O error and made progress after the restart, the file system is
# still mounted read-write, `fsck.ext4 -fn` is clean, and every file recorded reads back with
# its checksum after a remount. Then, with the target down for good, a read through an export
# with a 2 s --reconnect-timeout fails with EIO. Needs root, nbdfuse, fuse3 and a free loop
# device.
#
#   ops/nbd-restart.sh            (no options; -h or --help prints this)
#
# Exit 0: passed; 1: failed; 77: could not run here (the reason is printed); 130 or 143:
# interrupted by SIGINT or SIGTERM (everything it started is stopped and unmounted first).
set -euo pipefail
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "nbd-restart: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
# Stopped by a kill -INT of its process group even when started in the background.
# shellcheck source=lib/interrupts.sh
source "$(dirname "$0")/lib/interrupts.sh"
restart_with_default_sigint "$@"
cd "$(dirname "$0")/.."
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*" >&2; exit 1; }

for tool in nbdfuse fusermount3 losetup mkfs.ext4 fsck.ext4 sha256sum; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (ops/test.sh installs libnbd-bin, fuse3, e2fsprogs)"
done
[ "$(id -u)" = 0 ] || skip "needs root (losetup, mount)"
[ -e /dev/fuse ] || skip "no /dev/fuse"
losetup --find >/dev/null 2>&1 || skip "no free loop device"
# shellcheck source=lib/profile.sh
. ops/lib/profile.sh
bin=$netdam_bin
[ -x "$bin/netdam" ] && [ -x "$bin/netdam-target" ] || fail "build the binaries first: cargo build --profile $netdam_profile --bins"

# shellcheck source=lib/nbd-stack.sh
. ops/lib/nbd-stack.sh
work=$(mktemp -d -t netdam-restart.XXXXXX)
pids=()
target_pid=""
workload_pid=""
export_pid=""
loop=""
interrupted=""
cleanup() {
  set +e
  # A second Ctrl-C must not leave the stack half taken down.
  trap '' INT TERM
  [ -n "$interrupted" ] && echo "nbd restart: interrupted by $interrupted; stopping the workload and taking the stack down" >&2
  # The shell reports each process that the teardown ends by a signal ("Killed", and nbdfuse's
  # "Aborted" when its export goes): expected here, so its messages are left out.
  take_down 2>/dev/null
  remove_work_dir
}
take_down() {
  local stop_signal=TERM
  touch "$work/stop"
  if [ -n "$workload_pid" ]; then
    # Its dd or head would keep the file system busy: end them (by parent id) and it.
    pkill -P "$workload_pid"
    kill "$workload_pid"
  fi
  # While the target is down the export holds I/O up to --reconnect-timeout (30 s), and an
  # unmount or a dd in fsync waits with it; on SIGTERM an export drains, which waits too. An
  # interrupted run keeps nothing, and with the target gone nothing can be written: then the
  # exports end at once (SIGKILL), so that what is pending fails and the stack comes down now.
  [ -n "$interrupted" ] && stop_signal=KILL
  if [ -n "$loop" ] && [ -n "$export_pid" ] \
    && { [ -n "$interrupted" ] || [ -z "$target_pid" ] || ! kill -0 "$target_pid"; }; then
    kill -KILL "$export_pid"
  fi
  [ -n "$workload_pid" ] && wait "$workload_pid"
  release_nbd_stack
  # The exports first: one draining on SIGTERM waits for a target that went before it.
  for pid in "${pids[@]}"; do kill -"$stop_signal" "$pid"; done
  [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
  [ -n "$target_pid" ] && kill "$target_pid"
  wait
}
trap cleanup EXIT
# A signal (Ctrl-C, a CI timeout) exits through the same cleanup, with the shell's usual status.
trap 'interrupted=SIGINT; exit 130' INT
trap 'interrupted=SIGTERM; exit 143' TERM

port=$((20000 + RANDOM % 20000))
target="127.0.0.1:$port"
"$bin/netdam-target" namespace create disk --backend file --path disk.img --size 128MiB --data-dir "$work" >/dev/null
start_target() {
  "$bin/netdam-target" --data-dir "$work" --listen "$target" --metrics-listen 127.0.0.1:0 --poll blocking \
    >>"$work/target.log" 2>&1 &
  target_pid=$!
  for _ in $(seq 100); do "$bin/netdam" --target "$target" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  fail "the target did not start: $(tail -5 "$work/target.log")"
}
start_target
# The target requires tenants (the default); the export uses its default tenant's key file,
# which stays valid across the restarts (the store keeps the tenant).
export NETDAM_KEY="$work/tenants/default.key"

"$bin/netdam" --target "$target" nbd --namespace disk --listen "unix:$work/nbd.sock" --reconnect-timeout 30 \
  >"$work/nbd.log" 2>&1 &
export_pid=$!
pids+=("$export_pid")
for _ in $(seq 50); do [ -S "$work/nbd.sock" ] && break; sleep 0.1; done
[ -S "$work/nbd.sock" ] || fail "the export did not come up: $(cat "$work/nbd.log")"

mkdir -p "$work/fuse" "$work/mnt"
nbdfuse "$work/fuse/disk" "nbd+unix:///?socket=$work/nbd.sock" >"$work/nbdfuse.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -e "$work/fuse/disk" ] && break; sleep 0.1; done
[ -e "$work/fuse/disk" ] || fail "nbdfuse did not come up: $(cat "$work/nbdfuse.log")"
loop=$(losetup --find --show --sector-size 4096 "$work/fuse/disk")
mkfs.ext4 -q -F -b 4096 "$loop"
mount "$loop" "$work/mnt"

# The workload: files of up to 256 KiB written and fsynced one after another (dd conv=fsync),
# each recorded with its checksum once it is durable; stops at the first error, or when asked.
workload() {
  local i=0 size
  while [ ! -e "$work/stop" ]; do
    i=$((i + 1))
    size=$(( (i * 7919) % 262144 + 1 ))
    head -c "$size" /dev/urandom >"$work/source"
    dd if="$work/source" of="$work/mnt/f$((i % 200))" bs=64k conv=fsync status=none || return 1
    echo "$(sha256sum <"$work/source" | cut -d' ' -f1)  f$((i % 200))" >>"$work/written"
    # Renamed into place: a reader never sees the file empty, half written.
    echo "$i" >"$work/count.next" && mv "$work/count.next" "$work/count"
  done
}
workload >"$work/workload.log" 2>&1 &
workload_pid=$!
count() { cat "$work/count" 2>/dev/null || echo 0; }
wait_for_files() {
  local from=$1 deadline=$((SECONDS + 30))
  while [ "$(count)" -lt $((from + 20)) ]; do
    kill -0 "$workload_pid" 2>/dev/null || fail "the workload stopped: $(cat "$work/workload.log")"
    [ $SECONDS -lt $deadline ] || fail "the workload made no progress in 30 s (at file $(count))"
    sleep 0.1
  done
}

echo "-- file workload on ext4 through nbdfuse + loop"
wait_for_files 0
before=$(count)
echo "-- SIGKILL netdam-target at file $before, down 1 s, started again on $target"
kill -KILL "$target_pid"
wait "$target_pid" 2>/dev/null || true
sleep 1
start_target
wait_for_files "$before"
after=$(count)
touch "$work/stop"
wait "$workload_pid" || fail "the workload saw an I/O error: $(cat "$work/workload.log")"
workload_pid=""
kill -0 "$export_pid" 2>/dev/null || fail "the export died: $(tail -5 "$work/nbd.log")"
grep -q " $work/mnt ext4 rw" /proc/mounts || fail "ext4 is no longer mounted read-write: $(grep "$work/mnt" /proc/mounts)"
echo "workload ran $((after - before)) more files after the restart; no I/O error"

umount "$work/mnt"
fsck.ext4 -fn "$loop" >"$work/fsck.log" 2>&1 || fail "fsck.ext4 found problems: $(cat "$work/fsck.log")"
echo "fsck.ext4 -fn clean"
mount "$loop" "$work/mnt"
# The last checksum recorded for each file is what it holds.
awk '{ last[$2] = $0 } END { for (file in last) print last[file] }' "$work/written" >"$work/expected"
(cd "$work/mnt" && sha256sum --quiet -c "$work/expected") || fail "a file lost what was written and fsynced to it"
echo "$(wc -l <"$work/expected") files read back with their checksums after a remount"
umount "$work/mnt"
losetup -d "$loop"
loop=""
fusermount3 -u "$work/fuse" 2>/dev/null || umount "$work/fuse"

if command -v qemu-io >/dev/null; then
  echo "-- a target that stays down: requests fail with EIO after --reconnect-timeout"
  "$bin/netdam" --target "$target" nbd --namespace disk --listen "unix:$work/short.sock" --reconnect-timeout 2 \
    >"$work/nbd-short.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 50); do [ -S "$work/short.sock" ] && break; sleep 0.1; done
  [ -S "$work/short.sock" ] || fail "the second export did not come up: $(cat "$work/nbd-short.log")"
  kill -KILL "$target_pid"
  wait "$target_pid" 2>/dev/null || true
  target_pid=""
  # In the background, so that a signal ends the wait at once (timeout puts qemu-io in a
  # process group of its own, out of reach of a Ctrl-C); the cleanup stops it.
  timeout 120 qemu-io -f raw -c 'read 0 4k' "nbd+unix:///?socket=$work/short.sock" >"$work/qemu-io.log" 2>&1 &
  reader_pid=$!
  pids+=("$reader_pid")
  wait "$reader_pid" || true
  # Reaped: out of the cleanup's list, whose kill might otherwise reach a process that took its pid.
  kept=()
  for pid in "${pids[@]}"; do [ "$pid" = "$reader_pid" ] || kept+=("$pid"); done
  pids=("${kept[@]}")
  out=$(cat "$work/qemu-io.log")
  echo "$out" | grep -q "Input/output error" || fail "a read with the target down did not fail with EIO: $out"
  echo "the read failed with EIO"
else
  echo "SKIPPED (this part): qemu-io is not installed (ops/test.sh installs qemu-utils)"
fi
echo "nbd restart: passed"
