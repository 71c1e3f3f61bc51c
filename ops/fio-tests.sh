#!/usr/bin/env bash
# fio through the netdam engine (libnetdam_fio.so) against a real netdam-target on loopback:
# - randwrite with verify=crc32c on a file namespace and a memory region, at iodepth 1 and 32
#   (coalescing on, the default, and off; and 32 with batched submission, which packs several
#   I/Os per datagram), with 1 and 2 sessions: fio writes, then reads every block back and
#   checks it; a second fio run (verify_only) reads the same blocks back through a new engine
#   and checks them again;
# - trims, and writes with fsync (the namespace's FLUSH); busy polling; blocking polling with
#   verify at iodepth 1 and 32 (the other jobs poll adaptively, the engine's default);
# - a job naming a namespace or region the target lacks fails, with a message naming it;
# - 512-byte I/Os at depth 256 on a namespace of 512-byte blocks (more than a target worker has
#   transfer buffers for when sessions share it), written and verified with 1 and 4 sessions:
#   an instruction answered busy is sent again, never an I/O error (the number of busy answers
#   each run got is printed);
# - the defaults: poll= is adaptive (fio --enghelp), the target comes from NETDAM_TARGET when
#   target= is not given, and the shipped job files (ops/fio/) parse with NETDAM_TARGET set and
#   unset; a write job's block size that the namespace's block does not divide is named as the
#   write block size;
# - short randread/randwrite runs at QD1 and QD32, whose IOPS and latency are printed for
#   orientation (measurements, not pass/fail criteria).
# Takes about half a minute. Exit status: 0 passed, 1 failed, 77 skipped (with "SKIPPED: why",
# e.g. when fio's source, which the engine is compiled against, cannot be obtained).
# NETDAM_FIO_SECONDS sets the length of each measured run (default 1; 0 leaves them out, as
# ops/test.sh does: they measure, they test nothing); NETDAM_FIO_PORT the
# target's UDP port (default: a free one in 20000-39999).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/profile.sh
. ops/lib/profile.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never
seconds="${NETDAM_FIO_SECONDS:-1}"
failures=0

step() { printf '\n== %s\n' "$*"; }
skip() {
  printf 'SKIPPED: %s\n' "$*"
  exit 77
}
fail() {
  printf 'FAILED: %s\n' "$*"
  failures=$((failures + 1))
}
pass() { printf 'ok: %s\n' "$*"; }

step "the fio engine (ops/fio-plugin.sh)"
plugin_status=0
library="$(bash ops/fio-plugin.sh)" || plugin_status=$?
case "$plugin_status" in
  0) echo "$library" ;;
  77) skip "the fio engine cannot be built on this machine (ops/fio-plugin.sh says why above)" ;;
  *)
    echo "ops/fio-plugin.sh failed (status $plugin_status)" >&2
    exit 1
    ;;
esac
if ! command -v jq >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null || skip "jq (to read fio's JSON) cannot be installed"
  else
    skip "jq (to read fio's JSON output) is missing and installing it needs root and apt-get"
  fi
fi

step "netdam-target"
# Built every time (a no-op when up to date): the engine speaks the protocol of the initiator
# source it was built from, and a target binary left from an older tree may not.
if ! cargo build --profile "$netdam_profile" --locked --quiet --bin netdam-target --bin netdam; then
  if [ -x "$netdam_bin/netdam-target" ] && [ -x "$netdam_bin/netdam" ]; then
    echo "warning: building netdam-target failed; using the binaries already in $netdam_bin" >&2
  else
    echo "cannot build netdam-target and netdam (see above)" >&2
    exit 1
  fi
fi

work="$(mktemp -d -t netdam-fio.XXXXXX)"
target_pid=""
cleanup() {
  if [ -n "$target_pid" ]; then
    kill "$target_pid" 2>/dev/null || true
    wait "$target_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# A free UDP port in 20000-39999: the target sets SO_REUSEPORT, so binding would not tell us
# if another target already serves the port; ask the kernel first.
port="${NETDAM_FIO_PORT:-}"
for _ in 1 2 3 4 5 6 7 8 9 10; do
  [ -z "$port" ] || break
  candidate=$((20000 + RANDOM % 20000))
  if [ -z "$(ss -Hlun "sport = :$candidate" 2>/dev/null)" ]; then
    port="$candidate"
    break
  fi
done
[ -n "$port" ] || skip "found no free UDP port in 20000-39999"
target="127.0.0.1:$port"
cat >"$work/target.toml" <<EOF
listen = "$target"
# Any free port: a target already serving metrics on the default port must not stop this one.
metrics_listen = "127.0.0.1:0"
data_dir = "$work"
poll = "blocking"
# A functional test: no need to lock the process's memory (and no failure where the memlock
# limit is low).
lock_memory = false

[[namespace]]
name = "disk"
backend = "file"
path = "disk.img"
size = "256MiB"
block_size = 4096

[[namespace]]
name = "d512"
backend = "file"
path = "d512.img"
size = "16MiB"
block_size = 512

[[region]]
name = "scratch"
backend = "mem"
size = "64MiB"
EOF
"$netdam_bin/netdam-target" --config "$work/target.toml" >"$work/target.log" 2>&1 &
# The target requires tenants (the default) and created its default tenant's key file: the
# netdam CLI and the fio engine take it from NETDAM_KEY.
export NETDAM_KEY="$work/tenants/default.key"
target_pid=$!
ready=0
for _ in $(seq 100); do
  if "$netdam_bin/netdam" --target "$target" namespaces >/dev/null 2>&1; then
    ready=1
    break
  fi
  kill -0 "$target_pid" 2>/dev/null || break
  sleep 0.1
done
if [ "$ready" != 1 ]; then
  echo "netdam-target did not come up on $target; its output:" >&2
  cat "$work/target.log" >&2
  exit 1
fi
echo "serving on $target (data in $work)"

# run_fio NAME ARGS...: one fio job through the engine; JSON in $work/NAME.json, stderr in
# $work/NAME.err. Returns fio's exit status.
# Runs in $work, without saving verify state: fio would otherwise leave *-verify.state files in
# the current directory.
run_fio() {
  local name="$1"
  shift
  (cd "$work" && fio --name="$name" --ioengine="external:$library" --target="$target" --bs=4k \
    --verify_state_save=0 --output-format=json --output="$work/$name.json" "$@" 2>"$work/$name.err")
}

# jobs_ok NAME: fio's JSON says no job failed and stderr reports no verify error.
jobs_ok() {
  local name="$1" errors
  errors="$(jq '[.jobs[].error] | add' "$work/$name.json" 2>/dev/null || echo "no JSON")"
  if [ "$errors" != 0 ]; then
    echo "job error field(s): $errors" >&2
    return 1
  fi
  if grep -q '^verify:' "$work/$name.err"; then
    grep '^verify:' "$work/$name.err" | head -3 >&2
    return 1
  fi
}

ios() { jq ".jobs[0].$2.total_ios" "$work/$1.json"; }

# written_and_verified NAME WHAT FIO_ARGS...: runs a randwrite job with verify=crc32c and passes
# when fio succeeded, no job failed and every block written was read back ("N WHAT").
written_and_verified() {
  local name="$1" what="$2" status=0
  shift 2
  run_fio "$name" --rw=randwrite --verify=crc32c --verify_fatal=1 "$@" || status=$?
  if [ "$status" = 0 ] && jobs_ok "$name" && [ "$(ios "$name" read)" = "$(ios "$name" write)" ]; then
    pass "$name: $(ios "$name" write) $what"
  else
    fail "$name: fio exited $status; $(head -c 600 "$work/$name.err")"
  fi
}

step "randwrite + verify=crc32c, then verify_only in a new fio run"
for space in namespace=disk region=scratch; do
  # Each run of a space gets its own 8 MiB: eight runs fit the 64 MiB region.
  slot=0
  # "32b": depth 32, with fio committing 8 I/Os at a time and sizes from 4 to 16 KiB, so that
  # the engine packs pieces of several I/Os into one datagram. "32n": depth 32 with coalescing
  # off (each I/O sent as fio commits it; "32" coalesces, the default).
  for depth in 1 32 32b 32n; do
    for sessions in 1 2; do
      name="verify-${space%%=*}-qd$depth-s$sessions"
      batch=()
      if [ "$depth" = 32b ]; then
        batch=(--iodepth_batch_submit=8 --bsrange=4k-16k)
      elif [ "$depth" = 32n ]; then
        batch=(--coalesce=0)
      fi
      # Each run its own 8 MiB and its own seed, so that no run can pass on an earlier one's data.
      job=(--"$space" --iodepth="${depth%[bn]}" --sessions="$sessions" --rw=randwrite --size=8m
        --offset=$((slot * 8))m --randseed=$((1000 + slot)) --verify=crc32c --verify_fatal=1 "${batch[@]}")
      slot=$((slot + 1))
      status=0
      run_fio "$name" "${job[@]}" || status=$?
      if [ "$status" != 0 ] || ! jobs_ok "$name"; then
        fail "$name: fio exited $status; $(head -c 600 "$work/$name.err")"
        continue
      fi
      written="$(ios "$name" write)" verified="$(ios "$name" read)"
      if [ "$written" -le 0 ] || [ "$verified" != "$written" ]; then
        fail "$name: wrote $written blocks but read back $verified"
        continue
      fi
      status=0
      run_fio "$name-again" "${job[@]}" --verify_only=1 || status=$?
      if [ "$status" != 0 ] || ! jobs_ok "$name-again"; then
        fail "$name (verify_only): fio exited $status; $(head -c 600 "$work/$name-again.err")"
        continue
      fi
      again="$(ios "$name-again" read)"
      if [ "$again" != "$written" ]; then
        fail "$name (verify_only): read back $again of $written blocks"
        continue
      fi
      pass "$name: $written blocks written, read back and verified twice"
    done
  done
done

step "trim, fsync, busy and adaptive polling"
for space in namespace=disk region=scratch; do
  name="trim-${space%%=*}"
  status=0
  run_fio "$name" --"$space" --rw=randtrim --bs=64k --size=8m --iodepth=8 || status=$?
  if [ "$status" = 0 ] && jobs_ok "$name" && [ "$(ios "$name" trim)" -gt 0 ]; then
    pass "$name: $(ios "$name" trim) trims"
  else
    fail "$name: fio exited $status; $(head -c 600 "$work/$name.err")"
  fi
  name="fsync-busy-${space%%=*}"
  status=0
  run_fio "$name" --"$space" --rw=randwrite --size=4m --iodepth=8 --fsync=16 --poll=busy \
    --verify=crc32c --verify_fatal=1 || status=$?
  syncs="$(jq '.jobs[0].sync.total_ios // 0' "$work/$name.json" 2>/dev/null || echo 0)"
  if [ "$status" = 0 ] && jobs_ok "$name" && [ "$syncs" -gt 0 ]; then
    pass "$name: $(ios "$name" write) writes, $syncs syncs, verified, with poll=busy"
  else
    fail "$name: fio exited $status, $syncs syncs; $(head -c 600 "$work/$name.err")"
  fi
  for depth in 1 32; do
    written_and_verified "blocking-qd$depth-${space%%=*}" "blocks written and verified with poll=blocking" \
      --"$space" --size=4m --iodepth="$depth" --poll=blocking
  done
done

step "encrypted sessions (encrypt=1): randwrite + verify=crc32c; without a key the job fails naming encrypt="
for space in namespace=disk region=scratch; do
  written_and_verified "encrypted-${space%%=*}" "blocks written and verified over encrypted sessions" \
    --"$space" --encrypt=1 --sessions=2 --size=4m --iodepth=16 --offset=48m
done
name="encrypted-without-key"
status=0
# No key anywhere: NETDAM_KEY unset, and a data directory holding no default tenant's key file.
mkdir -p "$work/no-key-home"
(
  unset NETDAM_KEY
  HOME="$work/no-key-home" XDG_DATA_HOME="$work/no-key-home" run_fio "$name" --namespace=disk --encrypt=1 \
    --rw=randread --size=1m
) || status=$?
expected="netdam: encrypt=1: encryption needs a tenant key"
if [ "$status" != 0 ] && grep -qF "$expected" "$work/$name.err"; then
  pass "$name: fio exited $status: $(grep -F "$expected" "$work/$name.err" | head -c 160)"
else
  fail "$name: fio exited $status, expected a failure saying '$expected'; stderr: $(head -c 600 "$work/$name.err")"
fi

step "a missing namespace or region fails the job, naming it"
for space in namespace=nosuch region=nosuch; do
  name="missing-${space%%=*}"
  status=0
  run_fio "$name" --"$space" --rw=randread --size=1m || status=$?
  expected="netdam: $space: the target has no ${space%%=*} \"nosuch\""
  if [ "$status" != 0 ] && grep -qF "$expected" "$work/$name.err"; then
    pass "$name: fio exited $status: $(grep -F "$expected" "$work/$name.err")"
  else
    fail "$name: fio exited $status, expected a failure saying '$expected'; stderr: $(head -c 600 "$work/$name.err")"
  fi
done

step "512-byte I/Os at depth 256: instructions answered busy are sent again, not failed"
# The target's count of instructions it answered busy (STAT status_busy).
answered_busy() { "$netdam_bin/netdam" --target "$target" stat | awk '$1 == "status_busy" { print $2 }'; }
for sessions in 1 4; do
  busy_before="$(answered_busy)"
  # Whether busy answers happen depends on timing (one session keeps within the worker's
  # buffers by itself); that a busy answer is sent again, not failed, is shown by the engine's
  # own test (initiator/fio/tests/engine.rs). The count says whether this run exercised it.
  written_and_verified "small-blocks-qd256-s$sessions" \
    "512-byte blocks written and verified" \
    --namespace=d512 --bs=512 --size=4m --iodepth=256 --sessions="$sessions"
  echo "   instructions answered busy in this run, each sent again: $(($(answered_busy) - busy_before))"
done

step "defaults: poll=adaptive, NETDAM_TARGET, the shipped job files; messages name the job's direction"
poll_default="$(fio --enghelp="$library,poll" 2>&1 | awk '$1 == "default:" { print $2 }')"
if [ "$poll_default" = adaptive ]; then
  pass "poll= defaults to adaptive"
else
  fail "poll= defaults to '$poll_default', not adaptive (fio --enghelp=$library,poll)"
fi
name="netdam-target-variable"
status=0
(cd "$work" && NETDAM_TARGET="$target" fio --name="$name" --ioengine="external:$library" --namespace=disk \
  --rw=randread --bs=4k --size=1m --number_ios=64 --output-format=json --output="$work/$name.json" \
  2>"$work/$name.err") || status=$?
if [ "$status" = 0 ] && jobs_ok "$name" && [ "$(ios "$name" read)" -gt 0 ]; then
  pass "$name: without target=, the engine ran on NETDAM_TARGET=$target"
else
  fail "$name: fio exited $status; $(head -c 600 "$work/$name.err")"
fi
for job_file in ops/fio/netdam-namespace.fio ops/fio/netdam-region.fio; do
  for variable in unset set; do
    status=0
    if [ "$variable" = unset ]; then
      env -u NETDAM_TARGET NETDAM_FIO="$library" fio --parse-only "$job_file" >"$work/parse.out" 2>&1 || status=$?
    else
      NETDAM_TARGET="$target" NETDAM_FIO="$library" fio --parse-only "$job_file" >"$work/parse.out" 2>&1 || status=$?
    fi
    if [ "$status" = 0 ]; then
      pass "$job_file parses with NETDAM_TARGET $variable"
    else
      fail "$job_file with NETDAM_TARGET $variable: fio --parse-only exited $status; $(head -c 300 "$work/parse.out")"
    fi
  done
done
name="write-block-size"
status=0
run_fio "$name" --namespace=disk --rw=write --bs=1000 --size=1m || status=$?
expected="netdam: namespace=disk: write block size 1000-1000"
if [ "$status" != 0 ] && grep -qF "$expected" "$work/$name.err"; then
  pass "$name: fio exited $status: $(grep -F "$expected" "$work/$name.err" | head -c 160)"
else
  fail "$name: fio exited $status, expected a failure saying '$expected'; stderr: $(head -c 600 "$work/$name.err")"
fi

# Each fio file is the whole namespace: a job of two would write over its own blocks, and
# verify would call that corruption. Refused, naming the option.
name="two-files"
status=0
run_fio "$name" --namespace=disk --rw=randwrite --nrfiles=2 --size=1m --verify=crc32c || status=$?
expected="netdam: job $name has 2 files (nrfiles= or a filename= list)"
if [ "$status" != 0 ] && grep -qF "$expected" "$work/$name.err"; then
  pass "$name: fio exited $status: $(grep -F "$expected" "$work/$name.err" | head -c 160)"
else
  fail "$name: fio exited $status, expected a failure saying '$expected'; stderr: $(head -c 600 "$work/$name.err")"
fi

if [ "$seconds" = 0 ]; then
  step "measured runs: left out (NETDAM_FIO_SECONDS=0)"
else
  step "measured runs (${seconds} s each; for orientation, not pass/fail)"
  printf '%-10s %-10s %4s %9s %12s %12s\n' space rw qd IOPS "mean (us)" "p99 (us)"
  for space in namespace=disk region=scratch; do
    for rw in randread randwrite; do
      for depth in 1 32; do
        name="measure-${space%%=*}-$rw-qd$depth"
        direction="${rw#rand}"
        status=0
        run_fio "$name" --"$space" --rw="$rw" --iodepth="$depth" --size=64m --time_based --runtime="$seconds" ||
          status=$?
        if [ "$status" != 0 ] || ! jobs_ok "$name"; then
          fail "$name: fio exited $status; $(head -c 600 "$work/$name.err")"
          continue
        fi
        jq -r --arg space "${space%%=*}" --arg rw "$rw" --arg qd "$depth" --arg d "$direction" \
          '.jobs[0][$d] | [$space, $rw, $qd, (.iops | floor), (.clat_ns.mean / 1000 * 10 | floor / 10),
            (.clat_ns.percentile["99.000000"] / 1000 | floor)] | @tsv' "$work/$name.json" |
          awk -F'\t' '{ printf "%-10s %-10s %4s %9s %12s %12s\n", $1, $2, $3, $4, $5, $6 }'
      done
    done
  done
fi

if ! kill -0 "$target_pid" 2>/dev/null; then
  fail "netdam-target died during the tests; its output: $(tail -n 20 "$work/target.log")"
fi
echo
if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) FAILED"
  exit 1
fi
echo "all fio checks passed"
