# Sourced by the ops scripts (from the repository's root): which cargo profile they build and
# run. `release` by default, what users and the benchmarks run. ops/test.sh sets
# NETDAM_PROFILE=dev: its scripts check function, not speed, and the dev build it has made for
# the tests is optimised already (Cargo.toml), so the suite is spared a second whole build.
# Sets netdam_profile (cargo's --profile) and netdam_bin (where that profile's binaries are).
netdam_profile="${NETDAM_PROFILE:-release}"
case "$netdam_profile" in
  release) netdam_bin=build/release ;;
  dev) netdam_bin=build/debug ;;
  *)
    echo "NETDAM_PROFILE=$netdam_profile: use release (the default) or dev" >&2
    exit 2
    ;;
esac
