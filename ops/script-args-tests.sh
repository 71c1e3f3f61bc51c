#!/usr/bin/env bash
# The ops scripts' command lines, checked without running any of them for real: for each script
# that takes options, --help exits 0 and prints its header comment (and nothing of its code), an
# unknown option exits 2 with a message naming it, and the bad values below exit 2 with a
# message naming the option, all before the script builds, mounts or starts anything. Each case
# runs twice: from the repository's root (bash ops/X.sh) and from inside ops/ (./X.sh).
# Tools a script would reach for once past its arguments (cargo, losetup, mount, ip, tc, fio,
# nbdfuse, perf, valgrind ...) are shadowed on PATH by stubs that record the call and fail, so a
# script that goes on is caught and does nothing. No root needed; takes a few seconds.
#
#   ops/script-args-tests.sh [--ops DIR]    (DIR: the scripts to check, default this script's
#                                            own directory; -h or --help prints this)
#
# Exit 0: every check passed; 1: a check failed (each is printed, ok: or FAILED:); 2: a wrong
# argument.
set -euo pipefail
ops=$(cd "$(dirname "$0")" && pwd)
while [ $# -gt 0 ]; do
  case "$1" in
    --ops) [ $# -ge 2 ] && [ -d "${2:-}" ] || { echo "script-args-tests: --ops needs a directory (see --help)" >&2; exit 2; }
      ops=$(cd "$2" && pwd); shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "script-args-tests: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
repo=$(dirname "$ops")

work=$(mktemp -d -t netdam-script-args.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/stubs"
for tool in cargo rustc losetup mount umount mkfs.ext4 fsck.ext4 nbdfuse fusermount3 nbdinfo qemu-img \
  qemu-io nbd-client ip tc fio perf valgrind callgrind_annotate promtool prometheus chromium \
  chromium-headless-shell apt-get; do
  printf '#!/bin/sh\necho "%s $*" >>"%s/ran"\nexit 97\n' "$tool" "$work" >"$work/stubs/$tool"
  chmod +x "$work/stubs/$tool"
done

passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAILED: $*"; failed=$((failed + 1)); }

# Runs ops/$1 with the remaining arguments from $where (root or ops), the stubs first on PATH.
# Sets status, out (stdout), err (stderr) and ran (the stubbed tools it called).
invoke() {
  local script=$1
  shift
  rm -f "$work/ran"
  status=0
  if [ "$where" = root ]; then
    (cd "$repo" && PATH="$work/stubs:$PATH" timeout 10 bash "ops/$script" "$@") \
      >"$work/out" 2>"$work/err" </dev/null || status=$?
  else
    (cd "$ops" && PATH="$work/stubs:$PATH" timeout 10 "./$script" "$@") \
      >"$work/out" 2>"$work/err" </dev/null || status=$?
  fi
  out=$(cat "$work/out")
  err=$(cat "$work/err")
  ran=""
  [ ! -e "$work/ran" ] || ran=$(tr '\n' ';' <"$work/ran")
}

# What a case looked like, for a failure's message.
seen() { echo "exit $status; stderr: $(head -c 300 <<<"$err"); ran: ${ran:-nothing}"; }

check_help() {
  local script=$1
  local what="ops/$script --help (from $where)"
  invoke "$script" --help
  if [ "$status" != 0 ]; then
    bad "$what: $(seen)"
  elif [ -n "$ran" ]; then
    bad "$what ran $ran"
  elif ! grep -q "ops/$script" <<<"$out"; then
    bad "$what prints no usage line naming ops/$script"
  elif grep -qv '^#' <<<"$out"; then
    # The sed range of the help ran past the header into the code.
    bad "$what prints more than its header comment: $(grep -v '^#' <<<"$out" | head -1)"
  else
    ok "$what: exit 0, $(wc -l <<<"$out") lines of header with the usage line"
  fi
}

# check_refused SCRIPT NAMED ARGUMENTS...: exit 2, and stderr names NAMED, before anything ran.
check_refused() {
  local script=$1 named=$2
  shift 2
  local what="ops/$script $* (from $where)"
  invoke "$script" "$@"
  if [ "$status" != 2 ]; then
    bad "$what: wanted exit 2; $(seen)"
  elif [ -n "$ran" ]; then
    bad "$what ran $ran before refusing"
  elif ! grep -qF -- "$named" <<<"$err"; then
    bad "$what: exit 2, but the message does not name $named: $(head -c 300 <<<"$err")"
  else
    ok "$what: exit 2, \"$(head -1 <<<"$err")\""
  fi
}

for where in root ops; do
  echo "== from $([ "$where" = root ] && echo "the repository's root" || echo "inside ops/")"
  for script in client-instructions.sh monitoring-tests.sh nbd-restart.sh netns-incast.sh performance.sh \
    soak.sh trace-block.sh; do
    check_help "$script"
    check_refused "$script" --no-such-option --no-such-option
  done
  check_refused nbd-restart.sh extra extra
  check_refused performance.sh --out --out
  check_refused trace-block.sh --poll --poll bogus
  check_refused trace-block.sh --depth --depth abc
  check_refused trace-block.sh --pattern --pattern foo
  check_refused trace-block.sh --depth --depth
  check_refused netns-incast.sh --rate --rate fast
  check_refused netns-incast.sh --initiators --initiators abc
  check_refused netns-incast.sh --seconds --seconds abc
  check_refused netns-incast.sh --initiators --initiators
  check_refused netns-incast.sh --size --size 0
  check_refused soak.sh --minutes --minutes abc
  check_refused soak.sh --minutes --minutes
  check_refused client-instructions.sh --requests --requests
done

echo "script arguments: $passed passed, $failed failed"
[ "$failed" = 0 ]
