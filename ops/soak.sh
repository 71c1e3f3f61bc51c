#!/usr/bin/env bash
# Soak (not run by CI): a mixed load on one netdam-target for a configurable time, sampled every
# 10 s into a CSV and an SVG plot; fails on growth or on any lost write.
#
#   ops/soak.sh [--minutes N] [--out DIR]      (default 10 minutes; DIR default: a new temp dir)
#
# Load, all at once:
#   - block: fio's nbd engine through `netdam nbd` (two sessions), 4 KiB random writes at depth
#     16 over 128 MiB with verify=crc32c checked every 256 writes (verify_backlog), fatal on a
#     mismatch; a final pass re-reads and checks every block written last;
#   - memory: a loop of one-shot `netdam` commands (each opens and closes its own session, so
#     sessions churn): 4 KiB WRITEs of random bytes to 64 slots of a persistent region, each
#     read back and compared at once, and FETCH_ADDs on a counter, each checked to return the
#     count of adds before it; at the end every slot holds its last write and the counter the
#     number of adds.
# Samples (soak.csv): seconds, the target's RSS (KiB) and open files, the export's RSS and open
# files, sessions open at the target, p50/p99/p99.9 service time (µs) of BWRITE and WRITE over
# the 10 s since the last sample (`netdam top --once --json --interval 10`), and the memory
# loop's rounds so far.
#
# Growth rule (after a 30 s warm-up; samples split into a first and a last third):
#   - RSS (target and export): the last third's median exceeds the first third's by more than
#     10 % + 4 MiB;
#   - open files (target and export): the last third's maximum exceeds the first third's by more
#     than 4;
#   - sessions open: the last third's maximum exceeds the first third's by more than 4 (the
#     export's two plus at most the memory loop's one, whatever the churn);
#   - p50 service time of BWRITE or WRITE: the last third's median is more than 10x the first
#     third's (a loose bound that catches a leak-driven slowdown). p99 and p99.9 are recorded
#     and plotted but not judged: on a shared machine other tenants set the tail (a 2-minute run
#     saw WRITE p99 go from 0.5 ms to 12 ms with nothing growing).
# Exit 0: passed; 1: failed (the reason is printed); 2: a wrong argument; 77: could not run here;
# 130 or 143: interrupted by SIGINT or SIGTERM (the load and the target are stopped first).
set -euo pipefail
usage_error() { echo "soak: $* (see --help)" >&2; exit 2; }
arguments=("$@")
minutes=10
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes|--out) [ $# -ge 2 ] && [ -n "$2" ] || usage_error "$1 needs a value" ;;&
    --minutes) minutes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    # Before the cd below: "$0" may be relative to where it was started.
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) usage_error "unknown option $1" ;;
  esac
done
[[ "$minutes" =~ ^[0-9]+$ ]] && [ "$((10#$minutes))" -ge 1 ] || usage_error "--minutes $minutes: give a whole number of minutes, at least 1"
minutes=$((10#$minutes))
# Stopped by a kill -INT of its process group even when started in the background.
# shellcheck source=lib/interrupts.sh
source "$(dirname "$0")/lib/interrupts.sh"
restart_with_default_sigint "${arguments[@]}"
cd "$(dirname "$0")/.."
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*" >&2; exit 1; }
for tool in fio python3; do
  command -v "$tool" >/dev/null || skip "$tool is not installed"
done
fio --enghelp=nbd >/dev/null 2>&1 || skip "this fio has no nbd engine"
bin=build/release
[ -x "$bin/netdam" ] && [ -x "$bin/netdam-target" ] || fail "build the binaries first: cargo build --release --bins"

work=$(mktemp -d -t netdam-soak.XXXXXX)
out=${out:-$(mktemp -d -t netdam-soak-results.XXXXXX)}
mkdir -p "$out"
pids=()
target_pid=""
interrupted=""
cleanup() {
  set +e
  trap '' INT TERM
  [ -n "$interrupted" ] && echo "soak: interrupted by $interrupted; stopping the load, the export and the target" >&2
  touch "$work/stop"
  # The load and the export first: an export draining on SIGTERM waits for its target. An
  # interrupted run keeps nothing, and a Ctrl-C ends the target too: then they end at once.
  local stop_signal=TERM
  [ -n "$interrupted" ] && stop_signal=KILL
  for pid in "${pids[@]}"; do kill -"$stop_signal" "$pid" 2>/dev/null; done
  [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}" 2>/dev/null
  [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null
  wait 2>/dev/null
  # The results stay; the target's files go. Its logs are copied next to the results first.
  cp "$work"/*.log "$out"/ 2>/dev/null
  rm -rf "$work"
  echo "results in $out"
}
trap cleanup EXIT
# A signal (Ctrl-C, a CI timeout) exits through the same cleanup, with the shell's usual status.
trap 'interrupted=SIGINT; exit 130' INT
trap 'interrupted=SIGTERM; exit 143' TERM

port=$((20000 + RANDOM % 20000))
target="127.0.0.1:$port"
metrics="http://127.0.0.1:$((port + 1))/metrics"
cat >"$work/soak.toml" <<EOF
listen = "$target"
metrics_listen = "127.0.0.1:$((port + 1))"
data_dir = "$work"
workers = 2
poll = "blocking"
pin_workers = false
[[region]]
name = "soak"
backend = "file"
path = "soak.region"
size = "16MiB"
[[namespace]]
name = "disk"
backend = "file"
path = "disk.img"
size = "256MiB"
EOF
"$bin/netdam-target" serve --config "$work/soak.toml" >"$work/target.log" 2>&1 &
target_pid=$!
export NETDAM_KEY="$work/tenants/default.key"
for _ in $(seq 100); do "$bin/netdam" --target "$target" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$bin/netdam" --target "$target" ping >/dev/null || fail "the target did not start: $(cat "$work/target.log")"

"$bin/netdam" --target "$target" nbd --namespace disk --listen "unix:$work/nbd.sock" --sessions 2 \
  >"$work/nbd.log" 2>&1 &
export_pid=$!
pids+=("$export_pid")
for _ in $(seq 50); do [ -S "$work/nbd.sock" ] && break; sleep 0.1; done
[ -S "$work/nbd.sock" ] || fail "the export did not come up: $(cat "$work/nbd.log")"

seconds=$((minutes * 60))
echo "-- soak: $minutes minute(s) on $target; results in $out"

# Block load.
fio --name=soak --ioengine=nbd --uri="nbd+unix:///?socket=$work/nbd.sock" --rw=randwrite --bs=4k \
  --size=128m --iodepth=16 --time_based --runtime="$((seconds + 15))" --verify=crc32c --verify_backlog=256 \
  --verify_fatal=1 --verify_state_save=0 --output-format=json --output="$work/fio.json" >"$work/fio.log" 2>&1 &
fio_pid=$!
pids+=("$fio_pid")

# Memory load: each command is its own session. Every failure or mismatch is a lost write.
memory_load() {
  local n=0 adds=0 slot old
  mkdir -p "$work/slots"
  while [ ! -e "$work/stop" ]; do
    n=$((n + 1))
    slot=$((n % 64))
    head -c 4096 /dev/urandom >"$work/slots/$slot"
    "$bin/netdam" --target "$target" write soak $((slot * 4096)) --file "$work/slots/$slot" >/dev/null \
      || { echo "WRITE $n to slot $slot failed"; return 1; }
    "$bin/netdam" --target "$target" read soak $((slot * 4096)) 4096 --out "$work/back" >/dev/null \
      || { echo "READ $n of slot $slot failed"; return 1; }
    cmp -s "$work/slots/$slot" "$work/back" || { echo "slot $slot read back other bytes than WRITE $n"; return 1; }
    old=$("$bin/netdam" --target "$target" --json fetch-add soak $((64 * 4096)) 1 \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["old"])') \
      || { echo "FETCH_ADD $n failed"; return 1; }
    [ "$old" = "$adds" ] || { echo "FETCH_ADD $n returned $old after $adds adds"; return 1; }
    adds=$((adds + 1))
    echo "$n $adds" >"$work/memory-count"
  done
}
memory_load >"$work/memory.log" 2>&1 &
memory_pid=$!
pids+=("$memory_pid")

# Samples every 10 s.
echo "seconds,target_rss_kib,target_open_files,export_rss_kib,export_open_files,sessions_open,bwrite_p50_us,bwrite_p99_us,bwrite_p999_us,write_p50_us,write_p99_us,write_p999_us,memory_rounds" \
  >"$out/soak.csv"
rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
files() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 | wc -l; }
began=$SECONDS
while [ $((SECONDS - began)) -lt "$seconds" ]; do
  kill -0 "$target_pid" 2>/dev/null || fail "the target died: $(tail -5 "$work/target.log")"
  kill -0 "$export_pid" 2>/dev/null || fail "the export died: $(tail -5 "$work/nbd.log")"
  kill -0 "$memory_pid" 2>/dev/null || fail "the memory load stopped: $(cat "$work/memory.log")"
  kill -0 "$fio_pid" 2>/dev/null || fail "fio stopped early: $(tail -20 "$work/fio.log")"
  # Takes the 10 s it reports on: rates and percentiles between two scrapes.
  top=$("$bin/netdam" top --metrics "$metrics" --once --json --interval 10) || fail "cannot read $metrics"
  latency=$(python3 -c '
import json, sys
view = json.loads(sys.argv[1])
out = []
for opcode in ("bwrite", "write"):
    entry = view["opcodes"].get(opcode, {})
    for key in ("p50_us", "p99_us", "p999_us"):
        out.append(str(entry.get(key, "")))
print(",".join(out) + "|" + str(int(view["sessions_open"])))
' "$top")
  rounds=$(cut -d' ' -f1 "$work/memory-count" 2>/dev/null || echo 0)
  line="$((SECONDS - began)),$(rss "$target_pid"),$(files "$target_pid"),$(rss "$export_pid"),$(files "$export_pid"),${latency#*|},${latency%|*},$rounds"
  echo "$line" >>"$out/soak.csv"
  echo "$line"
done

echo "-- stopping the load (fio ends by itself within 15 s)"
touch "$work/stop"
wait "$fio_pid" || fail "fio failed (a verify error is a lost write): $(tail -30 "$work/fio.log")"
wait "$memory_pid" || fail "the memory load failed: $(cat "$work/memory.log")"
python3 - "$work/fio.json" <<'PY' || fail "fio reported errors (a verify error is a lost write)"
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
assert job["error"] == 0, job["error"]
print(f"fio: {job['write']['total_ios']} writes, {job['read']['total_ios']} verifying reads, no error")
PY
# Every slot holds its last write, and the counter every add.
read -r rounds adds <"$work/memory-count"
for file in "$work"/slots/*; do
  slot=$(basename "$file")
  "$bin/netdam" --target "$target" read soak $((slot * 4096)) 4096 --out "$work/back" >/dev/null
  cmp -s "$file" "$work/back" || fail "slot $slot lost its last write"
done
counter=$("$bin/netdam" --target "$target" --json fetch-add soak $((64 * 4096)) 0 | python3 -c 'import json, sys; print(json.load(sys.stdin)["old"])')
[ "$counter" = "$adds" ] || fail "the counter holds $counter after $adds answered adds"
echo "memory: $rounds rounds (WRITE + READ + FETCH_ADD, each its own session), every slot and the counter intact"

python3 - "$out/soak.csv" "$out/soak.svg" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def series(key):
    return [(float(r["seconds"]), float(r[key])) for r in rows if r[key] not in ("", "None")]
panels = [
    ("RSS (MiB)", [("target", "target_rss_kib", 1 / 1024), ("export", "export_rss_kib", 1 / 1024)]),
    ("open files", [("target", "target_open_files", 1), ("export", "export_open_files", 1)]),
    ("sessions open", [("target", "sessions_open", 1)]),
    ("BWRITE service time (µs)", [("p50", "bwrite_p50_us", 1), ("p99", "bwrite_p99_us", 1), ("p99.9", "bwrite_p999_us", 1)]),
    ("WRITE service time (µs)", [("p50", "write_p50_us", 1), ("p99", "write_p99_us", 1), ("p99.9", "write_p999_us", 1)]),
]
colors = ["#1f77b4", "#d62728", "#2ca02c"]
width, panel_h, left, top = 760, 150, 70, 30
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + len(panels) * (panel_h + 40)}" '
       'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>',
       f'<text x="{left}" y="18" font-size="14">netdam soak: {len(rows)} samples</text>']
t_max = max((float(r["seconds"]) for r in rows), default=1) or 1
for index, (title, lines) in enumerate(panels):
    y0 = top + index * (panel_h + 40) + 20
    values = [v * scale for _, key, scale in lines for _, v in series(key)]
    v_max = max(values, default=1) * 1.1 or 1
    svg.append(f'<text x="{left}" y="{y0 - 5}">{title}</text>')
    svg.append(f'<rect x="{left}" y="{y0}" width="{width - left - 20}" height="{panel_h}" fill="none" stroke="#999"/>')
    svg.append(f'<text x="{left - 5}" y="{y0 + 10}" text-anchor="end">{v_max:.4g}</text>')
    svg.append(f'<text x="{left - 5}" y="{y0 + panel_h}" text-anchor="end">0</text>')
    svg.append(f'<text x="{width - 20}" y="{y0 + panel_h + 14}" text-anchor="end">{t_max:.0f} s</text>')
    for number, (label, key, scale) in enumerate(lines):
        points = " ".join(f"{left + t / t_max * (width - left - 20):.1f},{y0 + panel_h - v * scale / v_max * panel_h:.1f}"
                          for t, v in series(key))
        svg.append(f'<polyline points="{points}" fill="none" stroke="{colors[number]}" stroke-width="1.5"/>')
        svg.append(f'<text x="{width - 25}" y="{y0 + 14 + 12 * number}" text-anchor="end" fill="{colors[number]}">{label}</text>')
svg.append("</svg>")
open(sys.argv[2], "w").write("\n".join(svg))
PY
echo "plot: $out/soak.svg"

# The growth rule (see the top of this file).
python3 - "$out/soak.csv" <<'PY' || fail "growth (see the rule at the top of ops/soak.sh)"
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if float(r["seconds"]) >= 30]
if len(rows) < 3:
    print(f"only {len(rows)} samples after the warm-up: too few to judge growth (run at least 1 minute)")
    sys.exit(0)
third = max(1, len(rows) // 3)
first, last = rows[:third], rows[-third:]
def values(part, key):
    return [float(r[key]) for r in part if r[key] not in ("", "None")]
problems = []
for key in ("target_rss_kib", "export_rss_kib"):
    a, b = statistics.median(values(first, key)), statistics.median(values(last, key))
    print(f"{key}: median {a:.0f} -> {b:.0f}")
    if b > a * 1.10 + 4096:
        problems.append(f"{key} grew from {a:.0f} to {b:.0f} KiB")
for key, slack in (("target_open_files", 4), ("export_open_files", 4), ("sessions_open", 4)):
    a, b = max(values(first, key)), max(values(last, key))
    print(f"{key}: max {a:.0f} -> {b:.0f}")
    if b > a + slack:
        problems.append(f"{key} grew from {a:.0f} to {b:.0f}")
for key in ("bwrite_p50_us", "write_p50_us"):
    a, b = values(first, key), values(last, key)
    if a and b:
        a, b = statistics.median(a), statistics.median(b)
        print(f"{key}: median {a:.1f} -> {b:.1f}")
        if b > 10 * a:
            problems.append(f"{key} grew from {a:.1f} to {b:.1f} µs")
for problem in problems:
    print("GROWTH:", problem)
sys.exit(1 if problems else 0)
PY
echo "soak: passed ($minutes minute(s), $(($(wc -l <"$out/soak.csv") - 1)) samples)"
