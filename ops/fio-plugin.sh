#!/usr/bin/env bash
# Builds the netdam fio ioengine, build/release/libnetdam_fio.so (build/debug/ with NETDAM_PROFILE=dev,
# ops/lib/profile.sh), for the fio that Debian bookworm
# ships (3.33), and prints its path on stdout (everything else goes to stderr), so that
#   fio --ioengine=external:$(ops/fio-plugin.sh) ...
# works. Idempotent: what is already installed, fetched or configured is left alone.
#
# How it is built: fio has no stable plugin ABI (an engine must be compiled against the very
# headers of the fio that loads it, and fio checks FIO_IOOPS_VERSION), so the C shim
# initiator/fio/shim/netdam_fio.c is compiled against fio 3.33's own headers, taken from
# Debian's source package. The Rust crate initiator/fio builds a static library with the engine
# itself (a tokio runtime per fio thread, the netdam clients); the shim and that library are
# linked into one shared object. The C shim is compiled by the crate's build.rs (the `cc`
# crate) when FIO_SOURCE names the configured fio source tree; this script sets it.
#
# Exit status: 0 with the path printed; 77 (with "SKIPPED: reason") when fio's source cannot be
# obtained on this machine (no root or apt-get, no network); 1 on any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
# shellcheck source=lib/profile.sh
. ops/lib/profile.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never
cache="$repo/build/fio-src"
fio_version_wanted="3.33"

say() { printf 'fio-plugin: %s\n' "$*" >&2; }
skip() {
  printf 'SKIPPED: %s\n' "$*" >&2
  exit 77
}
as_root_ok() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }

# The fio source directory holding the headers an engine is compiled against, once configured.
headers_dir() {
  local dir
  for dir in "$cache"/fio-"$fio_version_wanted"*/; do
    if [ -f "$dir/fio.h" ] && [ -f "$dir/ioengines.h" ]; then
      printf '%s\n' "${dir%/}"
      return 0
    fi
  done
  return 1
}

# 1. fio itself, a C compiler and dpkg-source (apt-get source unpacks with it).
missing=()
command -v fio >/dev/null || missing+=(fio)
command -v cc >/dev/null || missing+=(build-essential)
command -v dpkg-source >/dev/null || missing+=(dpkg-dev)
if [ "${#missing[@]}" -gt 0 ]; then
  as_root_ok || skip "needs ${missing[*]} and cannot install them (installing needs root and apt-get)"
  say "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio build-essential dpkg-dev >&2 ||
    skip "apt-get install fio build-essential dpkg-dev failed (no network or no package lists?)"
fi
installed_version="$(fio --version | sed 's/^fio-//')"
if [ "$installed_version" != "$fio_version_wanted" ]; then
  # The engine is bound to the headers of the fio that loads it; another fio needs another
  # source package, and this script only knows bookworm's.
  skip "fio $installed_version is installed; this engine is built for Debian bookworm's fio $fio_version_wanted"
fi

# 2. fio's source, from Debian (only when the headers are not cached already).
if ! headers_dir >/dev/null; then
  as_root_ok || skip "fio's source is not in $cache and fetching it needs root and apt-get"
  sources_file=/etc/apt/sources.list.d/netdam-deb-src.sources
  debian_sources=/etc/apt/sources.list.d/debian.sources
  if [ -f "$debian_sources" ]; then
    # The deb822 stanza for bookworm main (not bookworm-security), as a deb-src stanza with the
    # same URIs, Suites, Components and Signed-By.
    stanza="$(awk 'BEGIN { RS = ""; FS = "\n" }
      /(^|\n)Types:[^\n]*deb([ \n]|$)/ && /(^|\n)Suites:[^\n]* bookworm([ \n]|$)|(^|\n)Suites: *bookworm([ \n]|$)/ && /(^|\n)Components:[^\n]*main/ {
        print "# Added by ops/fio-plugin.sh: fio'"'"'s source, whose headers the netdam fio engine is built against."
        print "Types: deb-src"
        for (i = 1; i <= NF; i++) if ($i ~ /^(URIs|Suites|Components|Signed-By):/) print $i
        exit
      }' "$debian_sources")"
    [ -n "$stanza" ] || skip "no bookworm main entry in $debian_sources to derive a deb-src entry from"
    if [ ! -f "$sources_file" ] || [ "$(cat "$sources_file")" != "$stanza" ]; then
      say "adding $sources_file"
      printf '%s\n' "$stanza" >"$sources_file"
    fi
  elif ! grep -rqs '^deb-src .*bookworm' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    skip "no $debian_sources (deb822) and no deb-src line for bookworm: cannot fetch fio's source"
  fi
  if ! apt-get source --print-uris -qq fio >/dev/null 2>&1; then
    say "apt-get update (for the deb-src entry)"
    apt-get update -qq >&2 || skip "apt-get update failed (no network?)"
  fi
  mkdir -p "$cache"
  # The source of the very package installed (e.g. 3.33-3), so the headers match the binary.
  source_version="$(dpkg-query -W -f='${source:Version}' fio 2>/dev/null || true)"
  say "apt-get source fio${source_version:+=$source_version} into $cache"
  (cd "$cache" && apt-get source -qq "fio${source_version:+=$source_version}" >&2) ||
    skip "apt-get source fio${source_version:+=$source_version} failed (no network, or the archive no longer has it)"
fi
fio_source="$(headers_dir)" || skip "apt-get source fio left no fio.h and ioengines.h under $cache"

# 3. config-host.h: generated by fio's ./configure, which the headers include. Configured as
# debian/rules does, less --enable-gfio and --enable-libnbd, which only add programs and engines
# (and would need their -dev packages). CONFIG_* macros that depend on the libraries installed
# here (libaio, numa, rdma) change only struct members after every one the shim touches.
if [ ! -f "$fio_source/config-host.h" ]; then
  say "configuring fio's source (for config-host.h)"
  (cd "$fio_source" && ./configure --disable-native --prefix=/usr >"$cache/configure.log" 2>&1) || {
    say "fio's ./configure failed; its output is in $cache/configure.log"
    exit 1
  }
fi

# 4. The engine: Rust static library and C shim, linked into one shared object by build.rs.
say "building the engine against $fio_source"
if ! FIO_SOURCE="$fio_source" cargo build --profile "$netdam_profile" --locked --quiet --manifest-path initiator/fio/Cargo.toml >&2; then
  say "cargo build of initiator/fio failed (see above)"
  exit 1
fi
library="$repo/$netdam_bin/libnetdam_fio.so"
[ -f "$library" ] || {
  say "the build did not produce $library"
  exit 1
}
printf '%s\n' "$library"
