#!/usr/bin/env bash
# The client's user-space instructions per READ 64 B round trip, against the UDP echo floor's
# client, counted by valgrind's callgrind: issue 11's measure of client CPU where `perf` has no
# hardware counters (as on the VM this was written on).
#
#   ops/client-instructions.sh [--requests N]
#
# Runs `netdam-bench latency --poll blocking` under callgrind, counting only inside the two
# measuring loops (the floor's and netdam's, each with its timing harness), and prints their
# instructions per round trip, their ratio, and what of netdam's is `Client::call` and the
# datagram checksum (CRC-32C, the `crc32` instruction for a small datagram: valgrind runs it as
# the CPU does). Blocking clients, so that no spin loop is
# counted; the kernel's work, most of a round trip's CPU, is not counted on either side.
# Diagnosis, not a test: it needs valgrind (Debian: valgrind) and takes about a minute.
set -euo pipefail

requests=20000
while [[ $# -gt 0 ]]; do
    case "$1" in
        --requests) requests="${2:-}"; shift $(($# >= 2 ? 2 : 1)) ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "client-instructions: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
# Checked before the build, not by netdam-bench after it.
[[ $requests =~ ^[0-9]+$ ]] && ((10#$requests >= 1)) \
    || { echo "client-instructions: --requests '$requests': give a whole number of round trips, at least 1 (see --help)" >&2; exit 2; }
requests=$((10#$requests))
command -v valgrind >/dev/null || { echo "client-instructions: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cd "$(dirname "$0")/.."
cargo build --quiet --release -p netdam-bench
work=$(mktemp -d)
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$work"' EXIT
warmup=100
valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" \
    --toggle-collect='netdam_bench::floor::measure_with_cpu*' \
    --toggle-collect='netdam_bench::latency::measure_netdam*' \
    build/release/netdam-bench latency --poll blocking --requests "$requests" --warmup "$warmup" \
    >"$work/bench.out" 2>"$work/valgrind.out" || { cat "$work/valgrind.out" >&2; exit 1; }
callgrind_annotate --inclusive=yes "$work/callgrind.out" >"$work/annotated"

# Inclusive instructions of the function `$1` (a full path such as netdam_bench::floor::measure_with_cpu),
# per round trip: the largest count among the lines that name it, since callgrind lists a
# function once with its binary's name and, with LTO, again under each source file inlined into it.
per_round_trip() {
    awk -v name="$1" -v trips=$((requests + warmup)) '
        {
            line = $0; sub(/ *\[[^]]*\] *$/, "", line); sub(/ +$/, "", line)
            at = length(line) - length(name)
            # "FILE:name", not "FILE:outer::name" (a name that only ends like this one).
            if (substr(line, at) == ":" name && substr(line, at - 1, 1) != ":") {
                count = $1; gsub(",", "", count)
                if (count + 0 > best) best = count + 0
            }
        }
        END { if (best) printf "%.0f", best / trips; else printf "?" }' "$work/annotated"
}
floor=$(per_round_trip 'netdam_bench::floor::measure_with_cpu')
netdam=$(per_round_trip 'netdam_bench::latency::measure_netdam')
call=$(per_round_trip 'netdam_initiator::client::Client::call')
crc=$(per_round_trip 'netdam_isa::wire::datagram_crc')
echo "user-space instructions per READ 64 B round trip (callgrind, blocking clients, $requests round trips):"
echo "  floor client loop:   $floor"
echo "  netdam client loop:  $netdam  ($(awk -v a="$netdam" -v b="$floor" 'BEGIN { printf "%.1fx", a / b }') the floor's)"
echo "    of which Client::call:    $call"
echo "    of which datagram CRC-32C: $crc (both datagrams; the calls LTO left out of line)"
