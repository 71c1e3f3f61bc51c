#!/usr/bin/env bash
# Where a block request's time goes at depth, from the kernel's own tracepoints: netdam's worker
# (`netdam-bench block --no-fio`) and fio's io_uring engine on the same file, 4 KiB random I/O.
#
#   ops/trace-block.sh [FILE] [--poll busy|adaptive|blocking] [--depth N] [--pattern randread|randwrite]
#       (defaults: --poll busy --depth 32 --pattern randread; N from 1 to 256; -h or --help prints this)
#
# For each it prints, from 2 s of io_uring, block-layer and UDP system-call tracepoints in the
# middle of a run: the time from io_uring submission to completion, the block layer's time from
# issue to completion (the device's), how many completions arrive together, and, for netdam, the
# worker's own stages: a request received until submitted, a completion until its answer is
# sent. Diagnosis, not a test: it needs root and `perf` (Debian: linux-perf). The stages compare
# timestamps of the worker's thread only: hops between threads on other CPUs, paired the same
# way, gave inconsistent times on the VM this was written on. FILE (default: a 1 GiB file made
# in $TMPDIR, or /var/tmp) is made 1 GiB long first if it is shorter; not on tmpfs.
set -euo pipefail

usage_error() { echo "trace-block: $* (see --help)" >&2; exit 2; }
# Refuses option $1 without a value after it (or with another option there).
need_value() { [[ $# -ge 2 && $2 != -* ]] || usage_error "$1 needs a value"; }

file=""
poll=busy
depth=32
pattern=randread
while [[ $# -gt 0 ]]; do
    case "$1" in
        --poll) need_value "$@"; poll=$2; shift 2 ;;
        --depth) need_value "$@"; depth=$2; shift 2 ;;
        --pattern) need_value "$@"; pattern=$2; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        -*) usage_error "unknown option $1" ;;
        *) [[ -z $file ]] || usage_error "one FILE only, not also $1"; file="$1"; shift ;;
    esac
done
# Checked here, before the build and the 1 GiB file, rather than by netdam-bench or fio later.
[[ $poll =~ ^(busy|adaptive|blocking)$ ]] || usage_error "--poll $poll: give busy, adaptive or blocking"
[[ $depth =~ ^[0-9]+$ ]] && ((10#$depth >= 1 && 10#$depth <= 256)) \
    || usage_error "--depth $depth: give a whole number of requests in flight, 1 to 256"
depth=$((10#$depth))
[[ $pattern =~ ^(randread|randwrite)$ ]] || usage_error "--pattern $pattern: give randread or randwrite"
[[ -n $file ]] && file=$(realpath -m "$file")
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { echo "trace-block: needs perf (apt-get install linux-perf)" >&2; exit 1; }
command -v fio >/dev/null || { echo "trace-block: needs fio (apt-get install fio)" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "trace-block: needs root for tracepoints" >&2; exit 1; }
cargo build --quiet --release -p netdam-bench
bench=build/release/netdam-bench
work=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
trap 'rm -rf "$work"' EXIT
[[ -n $file ]] || file="$work/block.img"
if [[ ! -f $file || $(stat -c %s "$file") -lt $((1 << 30)) ]]; then
    echo "preparing $file (1 GiB; pass an existing FILE to skip this)"
    # The benchmark fills the file with written blocks (holes would not reach the disk).
    $bench block --no-fio --depths 1 --seconds 0.1 --file "$file" >"$work/prepare.out" 2>&1 \
        || { cat "$work/prepare.out" >&2; exit 1; }
fi

events=(-e io_uring:io_uring_submit_req -e io_uring:io_uring_complete
        -e block:block_rq_issue -e block:block_rq_complete
        -e syscalls:sys_exit_recvmmsg --filter 'ret > 0' -e syscalls:sys_exit_sendmsg -e syscalls:sys_exit_sendto)

# Records 2 s of tracepoints, starting `delay` seconds after `command` starts.
trace() {
    local name="$1" delay="$2"
    shift 2
    "$@" >"$work/$name.out" 2>&1 &
    local pid=$!
    sleep "$delay"
    if ! perf record -q -a "${events[@]}" -o "$work/$name.data" -- sleep 2 >"$work/perf.out" 2>&1; then
        kill "$pid" 2>/dev/null || true
        echo "trace-block: perf record failed:" >&2
        cat "$work/perf.out" >&2
        exit 1
    fi
    wait "$pid" || { echo "trace-block: $name failed:" >&2; cat "$work/$name.out" >&2; exit 1; }
    perf script -i "$work/$name.data" -F comm,cpu,time,event,trace >"$work/$name.txt" 2>"$work/perf.out" \
        || { cat "$work/perf.out" >&2; exit 1; }
}

trace fio 2 fio --name=trace --filename="$file" --direct=1 --ioengine=io_uring --fixedbufs=1 \
    --registerfiles=1 --rw="$pattern" --bs=4k --iodepth="$depth" --time_based=1 --runtime=5 \
    --norandommap=1 --randrepeat=0
# One second of warm-up, then the read case; the write case follows it.
[[ $pattern == randread ]] && delay=3 || delay=14
trace netdam "$delay" "$bench" block --no-fio --depths "$depth" --seconds 10 --poll "$poll" --cc off --file "$file"

python3 - "$work" <<'EOF'
import re, statistics, sys
work = sys.argv[1]
line_re = re.compile(r'\s*(\S+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)')

def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1e6 if values else float('nan')

def mean_us(values):
    return statistics.mean(values) * 1e6 if values else float('nan')

def burst_sizes(times, gap=10e-6):
    """How many events arrive together: runs of events less than `gap` apart."""
    bursts, count, last = [], 0, None
    for at in times:
        if last is not None and at - last < gap:
            count += 1
        else:
            if count:
                bursts.append(count)
            count = 1
        last = at
    if count:
        bursts.append(count)
    return bursts

def report(name, thread_prefix, worker):
    submitted, in_ring, completions = {}, [], []
    issued, at_disk, disk_done = {}, [], []
    received, submits, sends = [], [], []
    for line in open(f"{work}/{name}.txt"):
        match = line_re.match(line)
        if not match:
            continue
        comm, _cpu, at, event, rest = match.groups()
        at = float(at)
        if event.startswith('block:'):
            # The disk's requests, whoever's context completes them (an interrupt's, often).
            sector = re.search(r'\) (\d+) \+ \d+', rest)
            if not sector:
                continue
            if event == 'block:block_rq_issue':
                issued[sector.group(1)] = at
            elif event == 'block:block_rq_complete':
                disk_done.append(at)
                started = issued.pop(sector.group(1), None)
                if started is not None:
                    at_disk.append(at - started)
            continue
        if not comm.startswith(thread_prefix):
            continue
        if event == 'io_uring:io_uring_submit_req':
            submitted[re.search(r'req (\S+),', rest).group(1)] = at
            submits.append(at)
        elif event == 'io_uring:io_uring_complete':
            completions.append(at)
            started = submitted.pop(re.search(r'req (\S+),', rest).group(1), None)
            if started is not None:
                in_ring.append(at - started)
        elif worker and event.startswith('syscalls:'):
            value = int(rest.split()[0], 16)
            if value <= 0 or value >= 1 << 63:
                continue
            if event.endswith('recvmmsg'):
                received += [at] * value
            elif event.endswith(('sendmsg', 'sendto')):
                sends.append((at, value, event.endswith('sendto')))
    if len(completions) < 2:
        print(f"{name}: too few io_uring completions traced ({len(completions)})")
        return
    span = completions[-1] - completions[0]
    print(f"{name}: {len(completions) / span:,.0f} completions/s")
    print(f"  io_uring, submission to completion: p50 {percentile(in_ring, .5):.0f} µs, mean {mean_us(in_ring):.0f}; "
          f"{statistics.mean(burst_sizes(completions)):.1f} completions at a time")
    if at_disk:
        print(f"  block layer, issue to completion (the disk): p50 {percentile(at_disk, .5):.0f} µs, "
              f"mean {mean_us(at_disk):.0f}; {statistics.mean(burst_sizes(disk_done)):.1f} at a time")
    if not worker:
        return
    # A worker submits in the order it receives and answers in the order it reaps, so the k-th
    # end pairs with the k-th start, once the ends of what began before the trace are skipped:
    # the fewest skipped that leave (almost) no end before its start.
    def stage(start, end, label):
        for skipped in range(64):
            pairs = [b - a for a, b in zip(start, end[skipped:])]
            if pairs and sum(1 for p in pairs if p < 0) <= len(pairs) / 1000:
                print(f"  {label}: p50 {percentile(pairs, .5):.0f} µs, p99 {percentile(pairs, .99):.0f}")
                return
        print(f"  {label}: cannot pair starts with ends")
    stage(received, submits, "received until submitted")
    # A train's answers have one size (the last may be shorter): the size a lone answer, sent
    # with `sendto`, has most often. Without lone answers the count per train is unknown.
    lone = [value for _, value, alone in sends if alone]
    if not lone:
        print("  completed until its answer is sent: no lone answer to tell an answer's size from")
        return
    size = max(set(lone), key=lone.count)
    answers = [at for at, value, _ in sends for _ in range(-(-value // size))]
    stage(completions, answers, "completed until its answer is sent")

report('fio', 'fio', False)
report('netdam', 'netdam-worker', True)
EOF
