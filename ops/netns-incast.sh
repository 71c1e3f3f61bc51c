#!/usr/bin/env bash
# Incast on real links: N initiators, each in its own network namespace, write into one target
# behind a bridge whose port toward the target is rate-limited with tc tbf (the bottleneck).
# Runs once with Swift congestion control on and once with a fixed window, and prints latency,
# throughput, retransmissions and the bottleneck's drops for both.
#
#   ops/netns-incast.sh [--initiators 8] [--seconds 5] [--rate 100mbit] [--size 1024] [--bin DIR]
#
# --initiators: 1 to 200; --seconds: a whole number of seconds per mode, at least 1; --rate: as
# tc writes a rate (100mbit, 1gbit, 12500kbps); --size: bytes per write, 1 to 8920; --bin: where
# netdam-target, netdam-bench and netdam are (default: build/release). -h or --help prints this.
# Needs root, ip netns, veth, a bridge and the tbf qdisc. Exits 77 with a reason when the
# machine lacks one; exits 1 if an initiator wrote nothing, or failed a write with Swift on (a
# fixed window may legitimately exhaust a request's attempts; that is reported); 2 on a wrong
# argument; 130 or 143 when interrupted by SIGINT or SIGTERM. Everything it creates lives in
# namespaces named after its process id and is removed on exit.
set -euo pipefail
usage_error() { echo "netns-incast: $* (see --help)" >&2; exit 2; }
arguments=("$@")
initiators=8 seconds=5 rate=100mbit size=1024 bin="$(cd "$(dirname "$0")/.." && pwd)/build/release"
while [ $# -gt 0 ]; do
  case "$1" in
    --initiators|--seconds|--rate|--size|--bin) [ $# -ge 2 ] && [ -n "$2" ] || usage_error "$1 needs a value" ;;&
    --initiators) initiators=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) usage_error "unknown option $1" ;;
  esac
done
# Checked before any namespace exists: a whole number from $3 to $4, or exit 2 naming option $1.
check_count() {
  [[ $2 =~ ^[0-9]+$ ]] && ((10#$2 >= $3 && 10#$2 <= $4)) || usage_error "$1 $2: give a whole number from $3 to $4"
}
# Addresses 10.201.0.11 and up: 200 initiators stay inside the /24.
check_count --initiators "$initiators" 1 200
check_count --seconds "$seconds" 1 86400
check_count --size "$size" 1 8920
initiators=$((10#$initiators)) seconds=$((10#$seconds)) size=$((10#$size))
# tc's rate syntax: a number and a unit (bit or bps, with k, m, g, t and an optional i).
[[ ${rate,,} =~ ^[0-9]+([.][0-9]+)?([kmgt]i?)?(bit|bps)$ ]] \
  || usage_error "--rate $rate: give a rate as tc writes it, such as 100mbit, 1gbit or 12500kbps"
# Stopped by a kill -INT of its process group even when started in the background.
# shellcheck source=lib/interrupts.sh
source "$(dirname "$0")/lib/interrupts.sh"
restart_with_default_sigint "${arguments[@]}"
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
load_pids=()
interrupted=""
cleanup() {
  set +e
  trap '' INT TERM
  [ -n "$interrupted" ] && echo "netns incast: interrupted by $interrupted; stopping the initiators and the target, removing the namespaces" >&2
  # Removing a namespace ends no process in it: the initiators and the target go first.
  for pid in "${load_pids[@]}"; do kill "$pid" 2>/dev/null; done
  [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null
  wait 2>/dev/null
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${p}(sw|t|i[0-9]+)$"); do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
# A signal (Ctrl-C, a CI timeout) ends the run at once, through the same cleanup.
trap 'interrupted=SIGINT; exit 130' INT
trap 'interrupted=SIGTERM; exit 143' TERM

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
  load_pids=()
  for k in $(seq 1 "$initiators"); do
    ip netns exec "${p}i$k" "$bin/netdam-bench" load --target 10.201.0.1:7800 --region incast \
      --offset $((k << 20)) --size "$size" --seconds "$seconds" --window 32 --cc "$mode" --base-target-us 400 \
      > "$work/$mode.$k.json" &
    load_pids+=($!)
  done
  # A signal ends this wait at once (the trap runs); each initiator's result is in its JSON.
  wait "${load_pids[@]}" 2>/dev/null || true
  load_pids=()
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
