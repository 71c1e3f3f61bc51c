#!/usr/bin/env bash
# The NBD export as a user drives it, with the stock tools: a netdam-target serving a file
# namespace, `netdam nbd` exporting it on a Unix socket and on TCP, then
#   nbdinfo --json (size, block sizes, flags, the base:allocation context), nbdinfo --map and
#   qemu-img map after a write and a discard (the discarded range is a hole, the written one
#   data), qemu-img convert of a random image in and out (checksums equal), fio's nbd engine with verify=crc32c at depth 1 and 32, and
#   nbdfuse -> losetup -> mkfs.ext4 -> mount -> a tree of files -> umount -> fsck.ext4 -fn ->
#   mount again and compare every file;
# then SIGTERM: the export drains and exits, and the target shows every session closed.
# The kernel nbd-client path runs only where /dev/nbd0 exists.
# Exit 0: passed; 1: failed; 77: could not run here (the reason is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*" >&2; exit 1; }

for tool in nbdinfo qemu-img nbdfuse fio losetup mkfs.ext4 fsck.ext4; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (ops/test.sh installs libnbd-bin, qemu-utils, fio, e2fsprogs)"
done
# shellcheck source=lib/profile.sh
. ops/lib/profile.sh
bin=$netdam_bin
[ -x "$bin/netdam" ] && [ -x "$bin/netdam-target" ] || fail "build the binaries first: cargo build --profile $netdam_profile --bins"

# shellcheck source=lib/nbd-stack.sh
. ops/lib/nbd-stack.sh
work=$(mktemp -d -t netdam-nbd.XXXXXX)
pids=()
loop=""
cleanup() {
  set +e
  release_nbd_stack
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  remove_work_dir
}
trap cleanup EXIT
# A signal (a CI timeout, Ctrl-C) exits through the same cleanup.
trap "exit 1" INT TERM

port=$((20000 + RANDOM % 20000))
target="127.0.0.1:$port"
"$bin/netdam-target" namespace create disk --backend file --path disk.img --size 256MiB --data-dir "$work" >/dev/null
"$bin/netdam-target" --data-dir "$work" --listen "$target" --metrics-listen 127.0.0.1:0 --poll blocking >"$work/target.log" 2>&1 &
pids+=($!)
# The target requires tenants (the default); the exports use its default tenant's key file.
export NETDAM_KEY="$work/tenants/default.key"
for _ in $(seq 50); do "$bin/netdam" --target "$target" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$bin/netdam" --target "$target" ping >/dev/null || fail "the target did not start: $(cat "$work/target.log")"

nbd_port=$((port + 1))
"$bin/netdam" --target "$target" nbd --namespace disk --listen "unix:$work/nbd.sock" --sessions 2 >"$work/nbd-unix.log" 2>&1 &
export_unix=$!
"$bin/netdam" --target "$target" nbd --namespace disk --listen "tcp:127.0.0.1:$nbd_port" >"$work/nbd-tcp.log" 2>&1 &
export_tcp=$!
pids+=("$export_unix" "$export_tcp")
unix_uri="nbd+unix:///?socket=$work/nbd.sock"
tcp_uri="nbd://127.0.0.1:$nbd_port"
for _ in $(seq 50); do [ -S "$work/nbd.sock" ] && nbdinfo "$tcp_uri" >/dev/null 2>&1 && break; sleep 0.1; done

echo "-- clients that hang up during the handshake do not stop the export"
python3 - "$work/nbd.sock" "$nbd_port" <<'PY'
import socket, sys
for _ in range(3):
    for family, address in ((socket.AF_UNIX, sys.argv[1]), (socket.AF_INET, ("127.0.0.1", int(sys.argv[2])))):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.connect(address)
        s.close()  # before reading the greeting: the server's write meets a closed socket
PY
sleep 0.3
kill -0 "$export_unix" 2>/dev/null || fail "the Unix export died when a client hung up: $(tail -3 "$work/nbd-unix.log")"
kill -0 "$export_tcp" 2>/dev/null || fail "the TCP export died when a client hung up: $(tail -3 "$work/nbd-tcp.log")"
echo "both exports still serve"

echo "-- nbdinfo"
info=$(nbdinfo --json "$unix_uri")
python3 - "$info" <<'PY' || fail "nbdinfo reports the export wrongly: $info"
import json, sys
export = json.loads(sys.argv[1])["exports"][0]
assert export["export-size"] == 256 << 20, export
assert export["block_size_minimum"] == 4096, export
for flag in ("can_flush", "can_fua", "can_trim", "can_zero", "can_multi_conn"):
    assert export[flag] is True, flag
assert export["is_read_only"] is False
assert "base:allocation" in export.get("contexts", []), export
print("size, block sizes, flags and the base:allocation context as claimed")
PY

echo "-- qemu-io: patterns, FUA, write-zeroes, discard, flush"
command -v qemu-io >/dev/null || fail "qemu-io is missing although qemu-img is installed"
qio() { qemu-io -f raw "$unix_uri" "$@" 2>&1; }
out=$(qio -c 'write -P 0xab 1M 1M' -c 'read -P 0xab 1M 1M' -c 'write -f -P 0xcd 3M 64k' \
  -c 'read -P 0xcd 3M 64k' -c 'write -z 1M 64k' -c 'read -P 0 1M 64k' -c 'discard 2M 64k' \
  -c 'read -P 0 2M 64k' -c 'read -P 0xab 1088k 64k' -c 'flush')
echo "$out" | grep -qiE "fail|error|mismatch|pattern verification" && fail "qemu-io: $out"
[ "$(echo "$out" | grep -c '^read ')" = 5 ] || fail "qemu-io did not read back five times: $out"
echo "patterns written and verified, FUA write, zeroes, discard reads as zeroes, flush"

echo "-- allocation: nbdinfo --map and qemu-img map see a discard as a hole"
# 1 MiB written at 192 MiB (away from what the other parts write), its second quarter discarded.
out=$(qio -c 'write -P 0x3c 192M 1M' -c 'discard 196864k 256k' -c 'read -P 0 196864k 256k' -c 'flush')
echo "$out" | grep -qiE "fail|error|mismatch|pattern verification" && fail "qemu-io: $out"
nbdinfo --map --json "$unix_uri" >"$work/map-nbdinfo.json" || fail "nbdinfo --map failed"
qemu-img map --output=json -f raw "$unix_uri" >"$work/map-qemu.json" || fail "qemu-img map failed"
python3 - "$work/map-nbdinfo.json" "$work/map-qemu.json" <<'PY' || fail "the maps do not show the discard as a hole"
import json, sys
M, K = 1 << 20, 1 << 10
nbdinfo = [(e["offset"], e["length"], e["type"] & 1 == 1) for e in json.load(open(sys.argv[1]))]
qemu = [(e["start"], e["length"], not e["data"]) for e in json.load(open(sys.argv[2]))]
def check(name, extents, start, end, hole):
    covering = [e for e in extents if e[0] < end and e[0] + e[1] > start]
    assert covering and covering[0][0] <= start and covering[-1][0] + covering[-1][1] >= end, (name, start, covering)
    assert all(e[2] == hole for e in covering), (name, start, end, hole, covering)
for name, extents in (("nbdinfo --map", nbdinfo), ("qemu-img map", qemu)):
    check(name, extents, 192 * M, 192 * M + 256 * K, False)
    check(name, extents, 192 * M + 256 * K, 192 * M + 512 * K, True)
    check(name, extents, 192 * M + 512 * K, 193 * M, False)
    check(name, extents, 250 * M, 256 * M, True)
print(f"written range is data, discarded range a hole ({len(nbdinfo)} extents from nbdinfo, {len(qemu)} from qemu-img)")
PY

echo "-- qemu-img convert in and out (64 MiB)"
head -c $((64 << 20)) /dev/urandom >"$work/image.raw"
qemu-img convert -n -f raw -O raw "$work/image.raw" "$unix_uri"
qemu-img convert -f raw -O raw "$tcp_uri" "$work/whole.raw"
head -c $((64 << 20)) "$work/whole.raw" >"$work/back.raw"
cmp "$work/image.raw" "$work/back.raw" || fail "qemu-img read back other bytes than it wrote"
echo "identical through the Unix socket in and TCP out"

echo "-- fio's nbd engine, verify=crc32c"
for depth in 1 32; do
  fio --name=nbd-qd$depth --ioengine=nbd --uri="$unix_uri" --rw=randwrite --bs=4k --size=32m \
    --offset=128m --iodepth=$depth --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    --output-format=json --output="$work/fio-$depth.json" >/dev/null \
    || fail "fio nbd engine at depth $depth: $(cat "$work/fio-$depth.json" 2>/dev/null | head -c 2000)"
  python3 - "$work/fio-$depth.json" "$depth" <<'PY' || fail "fio reported errors at depth $depth"
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
assert job["error"] == 0, job["error"]
print(f"depth {sys.argv[2]}: {job['write']['iops']:.0f} write IOPS, verified {job['read']['io_bytes']} bytes")
PY
done

echo "-- nbdfuse + loop + ext4"
if [ "$(id -u)" != 0 ] || [ ! -e /dev/fuse ] || ! losetup --find >/dev/null 2>&1; then
  echo "SKIPPED (this part): needs root, /dev/fuse and a free loop device"
else
  mkdir -p "$work/fuse" "$work/mnt" "$work/tree"
  nbdfuse "$work/fuse/disk" "$unix_uri" >"$work/nbdfuse.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 50); do [ -e "$work/fuse/disk" ] && break; sleep 0.1; done
  [ -e "$work/fuse/disk" ] || fail "nbdfuse did not come up: $(cat "$work/nbdfuse.log")"
  loop=$(losetup --find --show --sector-size 4096 "$work/fuse/disk")
  mkfs.ext4 -q -F -b 4096 "$loop"
  mount "$loop" "$work/mnt"
  for i in $(seq 1 60); do
    mkdir -p "$work/tree/d$((i % 6))"
    head -c $(( (i * 7919) % 300000 + 1 )) /dev/urandom >"$work/tree/d$((i % 6))/f$i"
  done
  cp -r "$work/tree/." "$work/mnt/"
  umount "$work/mnt"
  fsck.ext4 -fn "$loop" >"$work/fsck.log" 2>&1 || fail "fsck.ext4 found problems: $(cat "$work/fsck.log")"
  mount "$loop" "$work/mnt"
  diff -r --exclude=lost+found "$work/tree" "$work/mnt" || fail "files differ after a remount"
  umount "$work/mnt"
  losetup -d "$loop"
  loop=""
  fusermount3 -u "$work/fuse" 2>/dev/null || umount "$work/fuse"
  echo "ext4 made, filled, checked clean and read back identical"
fi

echo "-- kernel nbd-client"
if [ -e /dev/nbd0 ] && command -v nbd-client >/dev/null; then
  nbd-client -unix "$work/nbd.sock" /dev/nbd0 -b 4096 -N disk
  cmp -n $((64 << 20)) "$work/image.raw" /dev/nbd0 || fail "/dev/nbd0 reads other bytes"
  nbd-client -d /dev/nbd0
  echo "/dev/nbd0 reads what qemu-img wrote"
else
  echo "SKIPPED (this part): no /dev/nbd0 or nbd-client here (the kernel has no nbd module)"
fi

echo "-- SIGTERM drains and closes the sessions"
kill -TERM "$export_unix" "$export_tcp"
wait "$export_unix" || fail "the Unix export did not exit cleanly: $(tail -5 "$work/nbd-unix.log")"
wait "$export_tcp" || fail "the TCP export did not exit cleanly: $(tail -5 "$work/nbd-tcp.log")"
grep -q "stopped" "$work/nbd-unix.log" || fail "no 'stopped' line in the export's log"
open=$("$bin/netdam" --target "$target" --json stat | python3 -c 'import json,sys; print(json.load(sys.stdin)["sessions_open"])')
# The STAT itself runs in a session of its own (a target with tenants shows its counters to an
# authenticated admin only): that one is the only session left.
[ "$open" = 1 ] || fail "$((open - 1)) sessions still open at the target after the exports stopped"
echo "both exports stopped; no session left open at the target"
echo "nbd interop: passed"
