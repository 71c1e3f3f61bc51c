#!/usr/bin/env bash
# Where a block request's time goes at depth, from the kernel's own tracepoints: netdam's worker
# (`netdam-bench block --no-fio`) and fio's io_uring engine on the same file, 4 KiB random I/O.
#
#   ops/trace-block.sh [FILE] [--poll busy|adaptive] [--depth N] [--pattern randread|randwrite]
#
# For each it prints, from 2 s of io_uring and UDP system-call tracepoints in the middle of a run:
# the time from io_uring submission to completion (the device and the block layer), how many
# completions arrive together, and, for netdam, the worker's own stages: a request received
# until submitted, a completion until its answer is sent. Diagnosis, not a test: it needs root
# and `perf` (Debian: linux-perf). Timestamps are compared only within one CPU (the worker's):
# hops between CPUs, paired the same way, gave inconsistent times on the VM this was written on.
set -euo pipefail
cd "$(dirname "$0")/.."

file=""
poll=busy
depth=32
pattern=randread
while [[ $# -gt 0 ]]; do
    case "$1" in
        --poll) poll="$2"; shift 2 ;;
        --depth) depth="$2"; shift 2 ;;
        --pattern) pattern="$2"; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        -*) echo "trace-block: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) file="$1"; shift ;;
    esac
done
command -v perf >/dev/null || { echo "trace-block: needs perf (apt-get install linux-perf)" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "trace-block: needs root for tracepoints" >&2; exit 1; }
bench=build/release/netdam-bench
[[ -x $bench ]] || cargo build --release -p netdam-bench
work=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
trap 'rm -rf "$work"' EXIT
if [[ -z $file ]]; then
    file="$work/block.img"
    echo "preparing a 1 GiB file (pass FILE to reuse one; it must not be on tmpfs)"
    $bench block --no-fio --depths 1 --seconds 0.1 --file "$file" >/dev/null
fi

events=(-e io_uring:io_uring_submit_req -e io_uring:io_uring_complete
        -e syscalls:sys_exit_recvmmsg --filter 'ret > 0' -e syscalls:sys_exit_sendmsg -e syscalls:sys_exit_sendto)

# Records 2 s of tracepoints, starting `delay` seconds after `command` starts.
trace() {
    local name="$1" delay="$2"
    shift 2
    "$@" >"$work/$name.out" 2>&1 &
    local pid=$!
    sleep "$delay"
    perf record -q -a "${events[@]}" -o "$work/$name.data" -- sleep 2 >/dev/null 2>&1
    wait "$pid"
    perf script -i "$work/$name.data" -F comm,cpu,time,event,trace >"$work/$name.txt" 2>/dev/null
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

def report(name, worker_prefix):
    submitted, device, completions = {}, [], []
    received, submits, sends = [], [], []
    for line in open(f"{work}/{name}.txt"):
        match = line_re.match(line)
        if not match:
            continue
        comm, _cpu, at, event, rest = match.groups()
        at = float(at)
        if event == 'io_uring:io_uring_submit_req':
            submitted[re.search(r'req (\S+),', rest).group(1)] = at
            submits.append(at)
        elif event == 'io_uring:io_uring_complete':
            completions.append(at)
            started = submitted.pop(re.search(r'req (\S+),', rest).group(1), None)
            if started is not None:
                device.append(at - started)
        elif worker_prefix and comm.startswith(worker_prefix):
            value = int(rest.split()[0], 16)
            if value <= 0 or value >= 1 << 63:
                continue
            if event.endswith('recvmmsg'):
                received += [at] * value
            elif event.endswith(('sendmsg', 'sendto')):
                sends.append((at, value, event.endswith('sendto')))
    # A train's answers have one size (the last may be shorter): the size a lone answer, sent
    # with `sendto`, has most often.
    lone = [value for _, value, alone in sends if alone]
    size = max(set(lone), key=lone.count) if lone else 4136
    answers = [at for at, value, _ in sends for _ in range(-(-value // size))]
    if not completions:
        print(f"{name}: no io_uring completions traced")
        return
    bursts, count, last = [], 0, 0.0
    for at in completions:
        if at - last < 10e-6:
            count += 1
        else:
            if count:
                bursts.append(count)
            count = 1
        last = at
    span = completions[-1] - completions[0]
    print(f"{name}: {len(completions) / span:,.0f} completions/s; submission to completion p50 "
          f"{percentile(device, .5):.0f} µs, mean {statistics.mean(device) * 1e6:.0f}; completions arrive "
          f"{statistics.mean(bursts):.1f} at a time")
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
    if worker_prefix:
        stage(received, submits, "received until submitted")
        stage(completions, answers, "completed until its answer is sent")

report('fio', None)
report('netdam', 'netdam-worker')
EOF
