#!/usr/bin/env bash
# Incast on real links: N initiators, each in its own network namespace, write into one target
# behind a bridge whose port toward the target is rate-limited with tc tbf (the bottleneck).
# Runs once with Swift congestion control on and once with a fixed window, and prints latency,
# throughput, retransmissions and the bottleneck's drops for both.
#
#   ops/netns-incast.sh [--initiators 8] [--seconds 5] [--rate 100mbit] [--size 1024] [--bin DIR]
#
# Needs root, ip netns, veth, a bridge and the tbf qdisc. Exits 77 with a reason when the
# machine lacks one; exits 1 if an initiator wrote nothing, or failed a write with Swift on (a
# fixed window may legitimately exhaust a request's attempts; that is reported). Everything it creates lives in
# namespaces named after its process id and is removed on exit.
set -euo pipefail
initiators=8 seconds=5 rate=100mbit size=1024 bin="$(cd "$(dirname "$0")/.." && pwd)/build/release"
while [ $# -gt 0 ]; do
  case "$1" in
    --initiators) initiators=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) echo "unknown option $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done
skip() { echo "SKIPPED: netns incast: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null && command -v tc >/dev/null || skip "needs ip and tc (Debian package iproute2)"
for tool in netdam-target netdam-bench netdam; do
  [ -x "$bin/$tool" ] || { echo "$bin/$tool missing: cargo build --release --workspace" >&2; exit 1; }
done

p="nd$$"                 # namespace and interface prefix, unique per run
switch="${p}sw" target_ns="${p}t"
work="$(mktemp -d)"
target_pid=""
cleanup() {
  [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null && wait "$target_pid" 2>/dev/null
  for ns in $(ip netns list | awk '{print $1}' | grep "^${p}" || true); do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$switch" 2>/dev/null || skip "cannot create network namespaces here"
ip -n "$switch" link add br0 type bridge || skip "cannot create a bridge"
ip -n "$switch" link set br0 up
# host NAMESPACE ADDRESS PORT: a namespace with eth0 at ADDRESS, its peer PORT on the bridge.
host() {
  ip netns add "$1"
  ip link add eth0 netns "$1" type veth peer name "$3" netns "$switch" || skip "cannot create veth pairs"
  ip -n "$1" addr add "$2/24" dev eth0
  ip -n "$1" link set eth0 up
  ip -n "$1" link set lo up
  ip -n "$switch" link set "$3" master br0
  ip -n "$switch" link set "$3" up
}
host "$target_ns" 10.201.0.1 "${p}vt"
for k in $(seq 1 "$initiators"); do host "${p}i$k" "10.201.0.$((10 + k))" "${p}v$k"; done
# The bottleneck: the bridge port toward the target, 64 KiB of queue.
ip netns exec "$switch" tc qdisc add dev "${p}vt" root tbf rate "$rate" burst 16kb limit 64kb \
  || skip "the tbf qdisc is not available"

cat > "$work/target.toml" <<TOML
listen = "10.201.0.1:7800"
data_dir = "$work"
[[region]]
name = "incast"
backend = "mem"
size = "64MiB"
TOML
ip netns exec "$target_ns" "$bin/netdam-target" serve --config "$work/target.toml" > "$work/target.log" 2>&1 &
target_pid=$!
# The target requires tenants (the default): its default tenant's key file, for every initiator.
export NETDAM_KEY="$work/tenants/default.key"
for _ in $(seq 1 50); do
  ip netns exec "${p}i1" "$bin/netdam" --target 10.201.0.1:7800 ping >/dev/null 2>&1 && break
  sleep 0.1
done
ip netns exec "${p}i1" "$bin/netdam" --target 10.201.0.1:7800 ping >/dev/null || { cat "$work/target.log"; exit 1; }

drops() { ip netns exec "$switch" tc -s qdisc show dev "${p}vt" | awk '/dropped/ { gsub(",", ""); print $7; exit }'; }

# The unloaded fabric delay here is a veth pair, a bridge and one 1 KiB serialization at the
# bottleneck rate; Swift's base target must sit above it, so it is set for this link.
run() {
  local mode=$1 before after
  before=$(drops)
  for k in $(seq 1 "$initiators"); do
    ip netns exec "${p}i$k" "$bin/netdam-bench" load --target 10.201.0.1:7800 --region incast \
      --offset $((k << 20)) --size "$size" --seconds "$seconds" --window 32 --cc "$mode" --base-target-us 400 \
      > "$work/$mode.$k.json" &
  done
  wait $(jobs -p | grep -v "^$target_pid$") 2>/dev/null || true
  after=$(drops)
  python3 - "$mode" "$((after - before))" "$work"/"$mode".*.json <<'PY'
import json, statistics, sys
mode, drops, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = [json.loads(open(f).read()) for f in files]
if any("error" in r for r in rows):
    print(f"{mode}: an initiator failed: {[r for r in rows if 'error' in r]}"); sys.exit(1)
print(f"| {'swift on' if mode == 'on' else 'fixed window 32'} | {sum(r['mbit_per_s'] for r in rows):.1f} "
      f"| {statistics.median(r['latency_p50_us'] for r in rows):.0f} | {max(r['latency_p99_us'] for r in rows):.0f} "
      f"| {statistics.median(r['rtt_p50_us'] for r in rows):.0f} | {max(r['rtt_p99_us'] for r in rows):.0f} "
      f"| {sum(r['operations'] for r in rows)} | {sum(r['retransmissions'] for r in rows)} | {drops} "
      f"| {sum(r['failed'] for r in rows)} |")
# With the controller every write must complete. A fixed window overflowing the bottleneck may
# exhaust a request's attempts: that is part of what it shows, so it is reported, not failed.
failed = sum(r['failed'] for r in rows) if mode == 'on' else 0
sys.exit(1 if failed or min(r['operations'] for r in rows) == 0 else 0)
PY
}
echo "incast: $initiators initiators -> 1 target, bottleneck tbf $rate (64 KiB queue), ${size}-byte writes, ${seconds} s per mode"
echo "| mode | Mbit/s | latency p50 µs (median initiator) | latency p99 µs (worst initiator) | RTT p50 µs | RTT p99 µs | writes | retransmissions | bottleneck drops | failed |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
status=0
run on || status=1
run off || status=1
exit $status
