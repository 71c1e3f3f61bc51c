#!/usr/bin/env bash
# Reproduces the README's Performance section on this machine: every netdam-bench report (JSON,
# markdown and PNG plots) into the directory given (default docs/results). Takes about an hour
# (not timed whole: the five-round fio run took 23 minutes here, each five-round block run about
# 5, the rest about 16 before rounds) and wants the machine otherwise idle. Timings are
# measurements, never pass/fail.
#
#   ops/performance.sh [DIR]      (a relative DIR is under the repository; -h or --help prints this)
set -euo pipefail
out=docs/results
out_given=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    -*) echo "performance: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      [ -z "$out_given" ] || { echo "performance: one output directory only, not also $1 (see --help)" >&2; exit 2; }
      out=$1 out_given=1; shift ;;
  esac
done
cd "$(dirname "$0")/.."
cargo build --release --locked --bin netdam-bench
bench=./build/release/netdam-bench
mkdir -p "$out"
# What this machine takes from a spinning thread on each CPU: the tail below every other figure.
$bench noise --seconds 10 --out "$out/noise" > /dev/null
$bench latency --requests 100000 --warmup 10000 --poll busy,adaptive \
  --ops read,write,cas,fetch-add,vadd,bread,bwrite --sizes 64,512,4096,8192 --out "$out" > "$out/latency.txt"
# Issue 11's latency goals: each case against its own floor in 5 rounds, with the medians.
$bench latency --requests 100000 --warmup 10000 --poll busy --rounds 5 \
  --ops read,write,cas,fetch-add,bread --sizes 64,4096 --out "$out/latency-goals" > "$out/latency-goals.txt"
$bench throughput --depths 1,2,4,8,16,32,64,128 --seconds 2 --out "$out" > /dev/null
$bench throughput --op bread --sizes 4096 --depths 1,32 --batch 1 --seconds 2 --out "$out/bread-4k" > /dev/null
$bench throughput --op bread --sizes 4096 --depths 1,32 --batch 2 --seconds 2 --out "$out/bread-4k-batch2" > /dev/null
$bench allreduce --workers 2,4,8 --sizes 1MiB,16MiB,64MiB --repeats 3 --out "$out" > /dev/null
# Five rounds each: a single run's ratio to fio moves by 10-30% on a VM's disk.
$bench block --poll busy --rounds 5 --out "$out/block-busy" > /dev/null
$bench block --poll adaptive --rounds 5 --out "$out/block-adaptive" > /dev/null
$bench bulk --bytes 1GiB --rounds 5 --out "$out/bulk" > /dev/null
# fio through the engine and through `netdam nbd`, beside nbdkit: busy polling (the goals of the
# README's table), then the default adaptive worker with the engine's default poll=adaptive.
cargo build --release --locked --bin netdam
# The goals' run in five rounds (their medians settle what one run cannot), the adaptive one once.
$bench fio --seconds 5 --depths 1,32 --poll busy --rounds 5 --out "$out" > /dev/null
$bench fio --seconds 5 --depths 1,32 --poll adaptive --out "$out/fio-adaptive" > /dev/null
echo "reports in $out"
