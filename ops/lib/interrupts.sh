# shellcheck shell=bash
# Sourced, before any `cd`, by the scripts that take down what they started when interrupted
# (soak.sh, nbd-restart.sh, netns-incast.sh).

# Started in the background by a shell without job control, a script has SIGINT ignored, and
# bash cannot trap a signal that was ignored on entry: a kill -INT of its process group would
# then stop what it started but not the script, which could neither take the rest down nor say
# so. Runs the script again (same pid, same arguments: pass "$@" as it was given) with SIGINT at
# its default, once; where `env --default-signal` is missing, it goes on as it was started.
restart_with_default_sigint() {
  if [ -z "${NETDAM_SIGINT_RESET:-}" ] && (($(awk '/^SigIgn:/ { print "0x" $2 }' /proc/$$/status) & 2)) \
    && env --default-signal=INT true 2>/dev/null; then
    NETDAM_SIGINT_RESET=1 exec env --default-signal=INT bash "$0" "$@"
  fi
}
