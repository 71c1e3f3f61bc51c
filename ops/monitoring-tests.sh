#!/usr/bin/env bash
# The monitoring kit in ops/monitoring/ against a real Prometheus and a live, loaded netdam:
#   1. promtool: check config, check rules, the rules' unit tests (every alert firing and not);
#      the Grafana dashboard's structure (jq);
#   2. a netdam-target (a memory region and a pmem-file namespace in /dev/shm, metrics on a free
#      loopback port) and a `netdam nbd --metrics-listen` export of the namespace, loaded for
#      LOAD_SECONDS by fio's nbd engine (4 KiB random reads and writes) and a loop of
#      `netdam read`/`netdam write` of a region; `promtool check metrics` on a live scrape of each;
#   3. Debian's prometheus scraping both every second, with the rule files and the console
#      template, and through its HTTP API:
#      (a) every expression of the Grafana dashboard (variables substituted: $__rate_interval=1m,
#          $instance and $nbd_instance=.*), of the template variables, and of the recording rules
#          returns data, with at least one finite value; every recorded series exists; every rule
#          is healthy; every operand of each alert's expression (the sides of its comparisons
#          and of `and`, numbers aside) returns data. An alert's own expression is empty while it
#          does not fire, so its operands are what can be checked live; that the thresholds fire
#          is what the rules' unit tests check;
#      (b) quantiles agree with what clients measured over the same interval:
#          - PING: `netdam ping --json` prints the service time the target stamped in each answer,
#            the very value it records in netdam_service_time_seconds{opcode="ping"}; the p50,
#            p99 and p99.9 of those (exact, from every answer) must be within one bucket (1.19x)
#            of histogram_quantile over the same pings (bucket deltas between the scrape before
#            the first ping and the one after the last; the target's raw count must have grown by
#            exactly the number of pings, so the populations are the same);
#          - READ: histogram_quantile(0.99) of the target's READ service time over an interval
#            must be within one bucket of the p99 `netdam top --once --json` computed from the
#            same target's /metrics over that interval (its own parse and interpolation);
#          - the initiator's end-to-end BREAD p99 (netdam nbd's histogram, in Prometheus) must not
#            exceed fio's p99 of read latency over the run by more than a bucket: every fio read is
#            one BREAD of the export plus the NBD hop, so its latency bounds the initiator's. The
#            two are not equal (the hop, and a busy host's scheduling, add to fio's), so the
#            ratio is printed, not bounded from below;
#   4. a screenshot of /consoles/netdam.html in headless Chromium while the load runs: the PNG
#      must have many colours and graph lines (saturated pixels), and the HTML Prometheus
#      renders must carry data (rates of READ and BREAD, up counts).
# Every process it starts is stopped on exit. Prints ok:/FAILED: per check.
# Usage: ops/monitoring-tests.sh [--save-screenshot]   (copies the PNG to docs/monitoring-console.png;
# -h or --help prints this)
# Exit 0: passed; 1: failed; 2: a wrong argument; 77: could not run here (the reason is printed).
set -euo pipefail
save_screenshot=0
for arg in "$@"; do
  case "$arg" in
    --save-screenshot) save_screenshot=1 ;;
    # Before the cd below: "$0" may be relative to where it was started.
    -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
    *) echo "monitoring-tests: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
repo=$PWD
skip() { echo "SKIPPED: $*"; exit 77; }
fatal() { echo "FAILED: $*" >&2; exit 1; }
failures=0
ok() { echo "ok: $*"; }
bad() { echo "FAILED: $*"; failures=$((failures + 1)); }
step() { printf '\n== %s\n' "$*"; }

load_seconds=${LOAD_SECONDS:-24}
started=$(date +%s)

step "tools"
chromium_bin() { command -v chromium-headless-shell || command -v chromium || true; }
missing=""
for tool in prometheus promtool jq curl fio python3; do command -v "$tool" >/dev/null || missing="$missing $tool"; done
[ -n "$(chromium_bin)" ] || missing="$missing chromium"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # chromium-headless-shell: Chromium's headless build (no X libraries); prometheus brings promtool.
    apt-get install -y -qq --no-install-recommends prometheus jq curl fio python3 chromium-headless-shell >/dev/null
    echo "installed: prometheus jq curl fio python3 chromium-headless-shell"
  else
    skip "missing:$missing (needs root and apt-get to install them)"
  fi
fi
chromium=$(chromium_bin)
# shellcheck source=lib/profile.sh
. ops/lib/profile.sh
bin=$netdam_bin
[ -x "$bin/netdam" ] && [ -x "$bin/netdam-target" ] || fatal "build the binaries first: cargo build --profile $netdam_profile --bins"
prometheus --version 2>&1 | head -1

work=$(mktemp -d -p "$( [ -w /dev/shm ] && echo /dev/shm || echo /tmp )" netdam-monitoring.XXXXXX)
pids=()
loop_stop="$work/stop-loop"
cleanup() {
  set +e
  touch "$loop_stop"
  [ -n "${chromium_pid:-}" ] && kill -- -"$chromium_pid" 2>/dev/null
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap "exit 1" INT TERM

step "static checks: promtool and the dashboard's structure"
mon=ops/monitoring
if promtool check config "$mon/prometheus.yml" >"$work/out" 2>&1; then ok "promtool check config $mon/prometheus.yml"; else bad "promtool check config: $(cat "$work/out")"; fi
if promtool check rules "$mon"/rules/*.yml >"$work/out" 2>&1; then
  ok "promtool check rules: $(grep -o '[0-9]* rules found' "$work/out" | paste -sd, -)"
else
  bad "promtool check rules: $(cat "$work/out")"
fi
for test_file in "$mon"/rules/tests/*.yml; do
  if (cd "$(dirname "$test_file")" && promtool test rules "$(basename "$test_file")") >"$work/out" 2>&1; then
    ok "promtool test rules $test_file"
  else
    bad "promtool test rules $test_file: $(cat "$work/out")"
  fi
done
# Every alert has unit tests that make it fire and tests where it stays silent.
for alert in $(grep -o 'alert: [A-Za-z]*' "$mon/rules/netdam-alerts.yml" | cut -d' ' -f2); do
  tests="$mon/rules/tests/netdam-alerts-test.yml"
  firing=$(python3 - "$tests" "$alert" <<'PY'
import re, sys
# Each alert_rule_test case names its alert, then lists exp_alerts: "[]" (silent) or exp_labels (fires).
text = open(sys.argv[1]).read()
cases = re.split(r"eval_time:", text)[1:]
mine = [case for case in cases if re.search(r"alertname: " + sys.argv[2] + r"\b", case)]
print(sum(1 for c in mine if "exp_labels" in c), sum(1 for c in mine if re.search(r"exp_alerts: \[\]", c)))
PY
  ) || firing="0 0"
  read -r fires silent <<<"$firing"
  if [ "$fires" -ge 1 ] && [ "$silent" -ge 1 ]; then ok "alert $alert: unit tests where it fires ($fires) and where it does not ($silent)"
  else bad "alert $alert: $fires unit tests where it fires, $silent where it does not (want at least one of each)"; fi
done
dashboard="$mon/grafana/netdam-dashboard.json"
if problems=$(jq -r '
    def panels: .panels[] | select(.type != "row");
    [ (if (.schemaVersion // 0) < 36 then "schemaVersion \(.schemaVersion) < 36" else empty end),
      (if (.uid // "") == "" or (.title // "") == "" then "no uid or title" else empty end),
      (if ([.templating.list[] | select(.type == "datasource" and .query == "prometheus")] | length) != 1
         then "no Prometheus datasource variable" else empty end),
      (if ([.panels[].id] | length) != ([.panels[].id] | unique | length) then "panel ids repeat" else empty end),
      (panels | select(.datasource.uid != "${datasource}") | "panel \(.title): datasource is not $datasource"),
      (panels | select((.gridPos.w // 0) == 0 or (.gridPos.h // 0) == 0) | "panel \(.title): no gridPos"),
      (panels | select((.targets // []) | length == 0) | "panel \(.title): no targets"),
      (panels | .targets[]? | select((.expr // "") == "" or (.refId // "") == "") | "a target without expr or refId"),
      (["p50", "p99 ", "p99.9", "Jitter", "IOPS", "bytes", "errors", "Retransmissions", "window", "Block I/O in flight"][]
        as $want | select([panels | .title] | map(ascii_downcase | contains($want | ascii_downcase)) | any | not)
        | "no panel titled with \($want)")
    ] | .[]' "$dashboard") && [ -z "$problems" ]; then
  ok "dashboard: schemaVersion $(jq .schemaVersion "$dashboard"), $(jq '[.panels[] | select(.type != "row")] | length' "$dashboard") panels, $(jq '[.. | objects | select(has("expr")) ] | length' "$dashboard") expressions, a Prometheus datasource variable, every panel placed and queried"
else
  bad "dashboard structure: ${problems:-jq failed}"
fi

step "a live target and netdam nbd export"
free_port() { python3 -c 'import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if sys.argv[1] == "udp" else socket.SOCK_STREAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' "$1"; }
target="127.0.0.1:$(free_port udp)"
target_metrics="127.0.0.1:$(free_port tcp)"
nbd_metrics="127.0.0.1:$(free_port tcp)"
prom="127.0.0.1:$(free_port tcp)"
cat >"$work/netdam.toml" <<EOF
listen = "$target"
metrics_listen = "$target_metrics"
data_dir = "$work"
workers = 1
poll = "blocking"
pin_workers = false
lock_memory = false

[[region]]
name = "scratch"
backend = "mem"
size = "16MiB"

[[namespace]]
name = "disk"
backend = "pmem"
path = "disk.region"
size = "64MiB"
EOF
"$bin/netdam-target" --config "$work/netdam.toml" >"$work/target.log" 2>&1 &
# The default tenant's key file, which the target created (it requires tenants by default).
export NETDAM_KEY="$work/tenants/default.key"
pids+=($!)
for _ in $(seq 50); do "$bin/netdam" --target "$target" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$bin/netdam" --target "$target" ping >/dev/null || fatal "the target did not start: $(cat "$work/target.log")"
"$bin/netdam" --target "$target" nbd --namespace disk --listen "unix:$work/nbd.sock" --metrics-listen "$nbd_metrics" \
  >"$work/nbd.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$work/nbd.sock" ] && curl -sf "http://$nbd_metrics/metrics" >/dev/null && break; sleep 0.1; done
curl -sf "http://$nbd_metrics/metrics" >/dev/null || fatal "netdam nbd did not start: $(cat "$work/nbd.log")"
echo "target $target (metrics $target_metrics), netdam nbd on $work/nbd.sock (metrics $nbd_metrics)"

cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $repo/$mon/rules/netdam-recording.yml
  - $repo/$mon/rules/netdam-alerts.yml
scrape_configs:
  - job_name: netdam-target
    static_configs: [{targets: ["$target_metrics"]}]
  - job_name: netdam-nbd
    static_configs: [{targets: ["$nbd_metrics"]}]
EOF
promtool check config "$work/prometheus.yml" >/dev/null || fatal "the generated Prometheus config does not check"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" --web.listen-address="$prom" \
  --web.console.templates="$repo/$mon/consoles" --web.console.libraries="$repo/$mon/console_libraries" \
  --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://$prom/-/ready" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf "http://$prom/-/ready" >/dev/null || fatal "prometheus did not start: $(cat "$work/prometheus.log")"
# Prometheus applies new scrape targets every 5 s, so the first scrapes come a few seconds after
# it is ready: wait for three of each job, so every later window has a baseline.
for _ in $(seq 150); do
  scraped=$(curl -sf --get "http://$prom/api/v1/query" --data-urlencode 'query=count(count_over_time(up[1m]) >= 3)' \
    | jq -r '.data.result[0].value[1] // 0' 2>/dev/null || echo 0)
  [ "$scraped" = 2 ] && break
  sleep 0.2
done
[ "$scraped" = 2 ] || fatal "prometheus did not scrape both endpoints three times in 30 s: $(tail -5 "$work/prometheus.log")"
echo "prometheus on $prom, scraping both endpoints every second"

step "pings whose service times the client reads from the answers"
# Before the heavy load: a ping answered late is sent again, and the target then records two
# service times for one the client reports, so such a batch is not the same population as the
# histogram's; it is measured again (after a scrape), up to three times.
raw_ping_count() { curl -sf "http://$target_metrics/metrics" | awk '/^netdam_service_time_seconds_count\{opcode="ping"\}/ { print $2 }'; }
pings_sent=1000
for attempt in 1 2 3; do
  sleep 1.2
  ping_count_before=$(raw_ping_count)
  ping_start=$(date +%s.%N)
  "$bin/netdam" --json --target "$target" ping --count "$pings_sent" >"$work/pings.json"
  ping_end=$(date +%s.%N)
  ping_count_after=$(raw_ping_count)
  grown=$(python3 -c 'import sys; print(round(float(sys.argv[2]) - float(sys.argv[1])))' "$ping_count_before" "$ping_count_after")
  resent=$(jq -s '[.[] | select(.attempts > 1)] | length' "$work/pings.json")
  [ "$grown" = "$pings_sent" ] && [ "$resent" = 0 ] && break
  echo "batch $attempt: $resent pings were sent again, the target counted $grown; measuring again"
done

step "load for ${load_seconds}s: fio's nbd engine on the export, netdam read/write on a region"
fio_start=$(date +%s.%N)
fio --name=monitoring --ioengine=nbd --uri="nbd+unix:///?socket=$work/nbd.sock" --rw=randrw --rwmixread=70 --bs=4k \
  --size=48m --iodepth=4 --lat_percentiles=1 --time_based --runtime="$load_seconds" --output-format=json --output="$work/fio.json" \
  >"$work/fio.log" 2>&1 &
fio_pid=$!
pids+=("$fio_pid")
head -c $((256 << 10)) /dev/urandom >"$work/block.bin"
(
  while [ ! -e "$loop_stop" ]; do
    "$bin/netdam" --target "$target" read scratch 0 1MiB --out /dev/null >/dev/null 2>&1
    "$bin/netdam" --target "$target" write scratch 1MiB --file "$work/block.bin" >/dev/null 2>&1
  done
) &
pids+=($!)
sleep 4

for endpoint in "target $target_metrics" "export $nbd_metrics"; do
  read -r what address <<<"$endpoint"
  curl -sf "http://$address/metrics" >"$work/scrape-$what.txt"
  if promtool check metrics <"$work/scrape-$what.txt" >"$work/out" 2>&1; then
    ok "promtool check metrics on the live $what ($(grep -c '^# TYPE' "$work/scrape-$what.txt") families)"
  else
    bad "promtool check metrics on the live $what: $(head -20 "$work/out")"
  fi
done

# READ over an interval as `netdam top` computes it from the target's /metrics (in the background).
top_interval=15
top_start=$(date +%s.%N)
"$bin/netdam" --json top --metrics "http://$target_metrics/metrics" --once --interval "$top_interval" >"$work/top.json" 2>"$work/top.err" &
top_pid=$!
pids+=("$top_pid")

step "the console, while the load runs"
# Let the graphs (the last minute) hold fifteen seconds of load.
while python3 -c 'import sys, time; sys.exit(0 if time.time() < float(sys.argv[1]) + 15 else 1)' "$fio_start"; do sleep 0.2; done
console_url="http://$prom/consoles/netdam.html?range=1m"
curl -sf "$console_url" >"$work/console.html" || bad "GET /consoles/netdam.html failed"
# In its own process group, so that a hung Chromium goes with all its children.
setsid "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$work/chromium" --window-size=1400,1800 \
  --virtual-time-budget=10000 --screenshot="$work/console.png" "$console_url" >"$work/chromium.log" 2>&1 &
chromium_pid=$!
pids+=("$chromium_pid")
for _ in $(seq 600); do kill -0 "$chromium_pid" 2>/dev/null || break; sleep 0.1; done
kill -- -"$chromium_pid" 2>/dev/null || true
wait "$chromium_pid" 2>/dev/null || true
if [ -s "$work/console.png" ]; then
  if stats=$(python3 - "$work/console.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat = 8, b""
while pos < len(data):
    length, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + length]
    if kind == b"IHDR":
        width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
        idat += body
    pos += 12 + length
assert depth == 8 and colour_type in (2, 6) and interlace == 0, "an 8-bit RGB(A) PNG expected"
bpp = 3 if colour_type == 2 else 4
raw, stride = zlib.decompress(idat), width * bpp
previous = bytearray(stride)
colours, saturated = set(), 0
for y in range(height):
    kind = raw[y * (stride + 1)]
    row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if kind == 1:
        for i in range(bpp, stride):
            row[i] = (row[i] + row[i - bpp]) & 255
    elif kind == 2:
        row = bytearray((a + b) & 255 for a, b in zip(row, previous))
    elif kind == 3:
        for i in range(stride):
            row[i] = (row[i] + ((row[i - bpp] if i >= bpp else 0) + previous[i]) // 2) & 255
    elif kind == 4:
        for i in range(stride):
            a, b = (row[i - bpp] if i >= bpp else 0), previous[i]
            c = previous[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    pixels = bytes(row)
    for x in range(0, stride, bpp):
        r, g, b = pixels[x], pixels[x + 1], pixels[x + 2]
        colours.add((r, g, b))
        saturated += max(r, g, b) - min(r, g, b) > 80
    previous = row
print(width, height, len(colours), saturated)
PY
  ); then
    read -r width height colours saturated <<<"$stats"
    # A blank or error page has a few dozen colours and no saturated pixels; the graphs' lines and
    # legends (Rickshaw's palette) give thousands of each.
    if [ "$colours" -ge 200 ] && [ "$saturated" -ge 2000 ]; then
      ok "screenshot ${width}x${height}, $(stat -c %s "$work/console.png") bytes, $colours colours, $saturated saturated pixels (graph lines and legends)"
    else
      bad "the screenshot looks blank: $colours colours, $saturated saturated pixels ($(tail -3 "$work/chromium.log"))"
    fi
  else
    bad "the screenshot is not a PNG we can read"
  fi
  if [ "$save_screenshot" = 1 ]; then cp "$work/console.png" docs/monitoring-console.png && echo "saved docs/monitoring-console.png"; fi
else
  bad "Chromium wrote no screenshot: $(tail -5 "$work/chromium.log")"
fi
cell() { grep -o "id=\"$1\">[^<]*" "$work/console.html" | head -1 | sed 's/.*>//'; }
positive() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$1" 2>/dev/null; }
if positive "$(cell rate-read)" && positive "$(cell rate-bread)" && positive "$(cell p99-read)" \
    && [ "$(cell targets-up)" = 1 ] && [ "$(cell exports-up)" = 1 ] && positive "$(cell initiator-rate)"; then
  ok "console HTML shows data: READ $(cell rate-read)/s p99 $(cell p99-read) µs, BREAD $(cell rate-bread)/s, initiator $(cell initiator-rate) requests/s, 1 target and 1 export up"
else
  bad "console HTML lacks data: READ rate '$(cell rate-read)', p99 '$(cell p99-read)', BREAD rate '$(cell rate-bread)', up '$(cell targets-up)'/'$(cell exports-up)'"
fi

step "waiting for the load to end"
wait "$top_pid" || bad "netdam top failed: $(cat "$work/top.err")"
wait "$fio_pid" || bad "fio failed: $(tail -5 "$work/fio.log")"
fio_end=$(date +%s.%N)
touch "$loop_stop"
# Two more scrapes and rule evaluations after the last request.
sleep 2.5

api() { curl -sf --get "http://$prom/api/v1/$1" "${@:2}"; }
query_at() { api query --data-urlencode "query=$1" ${2:+--data-urlencode "time=$2"}; }
# Succeeds when EXPR returns at least one sample (with a finite value if $2 = finite).
returns_data() {
  local answer
  answer=$(query_at "$1") || { echo "HTTP error"; return 1; }
  [ "$(jq -r .status <<<"$answer")" = success ] || { jq -r .error <<<"$answer"; return 1; }
  local count finite
  count=$(jq '.data.result | length' <<<"$answer")
  finite=$(jq '[.data.result[].value[1] | select(. != "NaN" and . != "+Inf" and . != "-Inf")] | length' <<<"$answer")
  [ "$count" -gt 0 ] || { echo "no data"; return 1; }
  if [ "${2:-}" = finite ] && [ "$finite" = 0 ]; then echo "$count series, none finite"; return 1; fi
  echo "$count series"
}

step "(a) every expression of the dashboard and the rules returns data"
substitute() { sed -e 's/\$__rate_interval/1m/g' -e 's/\${\?nbd_instance}\?/.*/g' -e 's/\${\?instance}\?/.*/g'; }
checked=0
while IFS= read -r expr; do
  expr=$(substitute <<<"$expr")
  if result=$(returns_data "$expr" finite); then checked=$((checked + 1)); else bad "dashboard expression returns $result: $expr"; fi
done < <(jq -r '.panels[] | .targets[]? | .expr' "$dashboard")
ok "dashboard: $checked panel expressions return data with finite values"
while IFS= read -r definition; do
  # label_values(METRIC, LABEL): the metric's series must exist and carry the label.
  metric=$(sed -E 's/label_values\(([^,]+), *([a-z_]+)\)/\1/' <<<"$definition")
  label=$(sed -E 's/label_values\(([^,]+), *([a-z_]+)\)/\2/' <<<"$definition")
  values=$(api series --data-urlencode "match[]=$metric" | jq -r --arg l "$label" '[.data[][$l] // empty] | unique | join(",")')
  if [ -n "$values" ]; then ok "dashboard variable $definition: $values"; else bad "dashboard variable $definition has no values"; fi
done < <(jq -r '.templating.list[] | select(.type == "query") | .definition' "$dashboard")

api rules >"$work/rules.json" || fatal "GET /api/v1/rules failed"
unhealthy=$(jq -r '.data.groups[].rules[] | select(.health != "ok") | "\(.name): \(.health) \(.lastError // "")"' "$work/rules.json")
rule_count=$(jq '[.data.groups[].rules[]] | length' "$work/rules.json")
if [ -z "$unhealthy" ] && [ "$rule_count" -ge 20 ]; then ok "prometheus loaded $rule_count rules, every one evaluated without error"; else bad "rules: ${unhealthy:-only $rule_count loaded}"; fi
checked=0
while IFS=$'\t' read -r name expr; do
  if result=$(returns_data "$expr" finite); then checked=$((checked + 1)); else bad "recording rule $name returns $result: $expr"; fi
  if ! result=$(returns_data "$name"); then bad "recorded series $name: $result"; fi
done < <(jq -r '.data.groups[].rules[] | select(.type == "recording") | [.name, (.query | gsub("\n"; " "))] | @tsv' "$work/rules.json")
ok "recording rules: $checked expressions return data with finite values, and their recorded series exist"
checked=0
while IFS=$'\t' read -r name expr; do
  # The operands of the expression's comparisons and set operators, at the outermost level.
  while IFS= read -r operand; do
    if result=$(returns_data "$operand"); then checked=$((checked + 1)); else bad "alert $name: operand returns $result: $operand"; fi
  done < <(python3 - "$expr" <<'PY'
import re, sys
expr = sys.argv[1]
def split(text):
    """Split at comparisons and and/or/unless outside (), {}, [] and quotes."""
    parts, depth, quote, start, i = [], 0, None, 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'`":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0:
            m = re.match(r"(==|!=|>=|<=|>|<)(\s*bool)?|\b(and|or|unless)\b", text[i:])
            if m and (m.group(3) is None or (i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "_:"))):
                parts.append(text[start:i]); i += m.end(); start = i; continue
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]
def strip_outer(text):
    """Drop parentheses that enclose the whole of text."""
    while text.startswith("(") and text.endswith(")"):
        depth = 0
        for j, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and j < len(text) - 1:
                return text
        text = text[1:-1].strip()
    return text
def operands(text):
    parts = split(text)
    if len(parts) > 1:
        for part in parts:
            yield from operands(part)
        return
    inner = strip_outer(parts[0])
    if inner != parts[0]:
        yield from operands(inner)
    elif not re.fullmatch(r"[\d.\s*+/()-]+", inner):
        yield inner
for operand in operands(expr):
    print(operand)
PY
  )
done < <(jq -r '.data.groups[].rules[] | select(.type == "alerting") | [.name, (.query | gsub("\n"; " "))] | @tsv' "$work/rules.json")
alert_count=$(jq '[.data.groups[].rules[] | select(.type == "alerting")] | length' "$work/rules.json")
ok "alerts: $checked operands of $alert_count alert expressions return data"

step "(b) quantiles from Prometheus against what clients measured"
within_bucket() { python3 -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if a > 0 and b > 0 and max(a / b, b / a) <= 2 ** 0.25 * 1.001 else 1)' "$1" "$2"; }
value_of() { jq -r '.data.result[0].value[1] // "none"' <<<"$1"; }
# PING: the same population on both sides.
pings=$(jq -s 'length' "$work/pings.json")
if [ "$grown" = "$pings" ] && [ "$resent" = 0 ]; then ok "the target recorded exactly the $pings pings answered, none sent twice ($ping_count_before -> $ping_count_after)"
else bad "the target's ping count grew by $grown ($ping_count_before -> $ping_count_after), $pings pings were answered, $resent sent again"; fi
at=$(python3 -c 'import sys; print(f"{float(sys.argv[1]) + 1.5:.3f}")' "$ping_end")
span_ms=$(python3 -c 'import sys; print(int((float(sys.argv[1]) + 1.5 - float(sys.argv[2])) * 1000) + 10)' "$ping_end" "$ping_start")
for quantile in 0.5 0.99 0.999; do
  client=$(jq -s --argjson q "$quantile" '[.[].service_time_us] | sort | .[(((length * $q) | ceil) - 1)]' "$work/pings.json")
  answer=$(query_at "histogram_quantile($quantile, sum by (le) (netdam_service_time_seconds_bucket{job=\"netdam-target\",opcode=\"ping\"} - netdam_service_time_seconds_bucket{job=\"netdam-target\",opcode=\"ping\"} offset ${span_ms}ms)) * 1e6" "$at")
  server=$(value_of "$answer")
  if within_bucket "$client" "$server"; then ok "PING service time q$quantile: client (from $pings answers) $client µs, Prometheus $(printf '%.2f' "$server") µs: within one bucket"
  else bad "PING service time q$quantile: client $client µs, Prometheus $server µs: more than one bucket (1.19x) apart"; fi
done
# READ: Prometheus against netdam top over the same interval. netdam top read /metrics as it
# started and again interval_s later; the deltas are taken between the scrapes nearest those two
# moments (Prometheus stamps a sample with its scrape's start).
top_p99=$(jq -r '.opcodes.read.p99_us // "none"' "$work/top.json")
read_count='netdam_service_time_seconds_count{job="netdam-target",opcode="read"}'
scrapes=$(query_at "${read_count}[60s]" "$(python3 -c 'import time; print(f"{time.time():.3f}")')" | jq -c '[.data.result[0].values[][0]]')
read -r top_first top_second <<<"$(python3 - "$scrapes" "$top_start" "$(jq -r .interval_s "$work/top.json")" <<'PY'
import json, sys
stamps, start, interval = json.loads(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
nearest = lambda t: min(stamps, key=lambda s: abs(s - t))
print(f"{nearest(start):.3f}", f"{nearest(start + interval):.3f}")
PY
)"
top_span_ms=$(python3 -c 'import sys; print(round((float(sys.argv[2]) - float(sys.argv[1])) * 1000))' "$top_first" "$top_second")
read_bucket='netdam_service_time_seconds_bucket{job="netdam-target",opcode="read"}'
answer=$(query_at "histogram_quantile(0.99, sum by (le) ($read_bucket - $read_bucket offset ${top_span_ms}ms)) * 1e6" "$top_second")
server=$(value_of "$answer")
if within_bucket "$top_p99" "$server"; then ok "READ service time p99 over ${top_interval}s: netdam top $top_p99 µs, Prometheus $(printf '%.1f' "$server") µs: within one bucket"
else bad "READ service time p99 over ${top_interval}s: netdam top $top_p99 µs, Prometheus $server µs: more than one bucket apart"; fi
# BREAD end to end: the initiator's p99 is bounded by fio's.
fio_p99=$(jq -r '.jobs[0].read.lat_ns.percentile["99.000000"] / 1000' "$work/fio.json")
fio_reads=$(jq -r '.jobs[0].read.total_ios' "$work/fio.json")
fio_at=$(python3 -c 'import sys; print(f"{float(sys.argv[1]) + 1.5:.3f}")' "$fio_end")
fio_span_ms=$(python3 -c 'import sys; print(int((float(sys.argv[1]) + 1.5 - float(sys.argv[2])) * 1000) + 10)' "$fio_end" "$fio_start")
bread='netdam_initiator_latency_seconds_bucket{job="netdam-nbd",opcode="bread"}'
# The export's BREAD series begin with fio's first read: before it, their counts were zero.
answer=$(query_at "histogram_quantile(0.99, sum by (le) ($bread - ($bread offset ${fio_span_ms}ms * 1 or $bread * 0))) * 1e6" "$fio_at")
initiator_p99=$(value_of "$answer")
breads=$(value_of "$(query_at "sum(netdam_initiator_requests_total{job=\"netdam-nbd\",opcode=\"bread\"})" "$fio_at")")
if python3 -c 'import sys; sys.exit(0 if 0 < float(sys.argv[1]) <= float(sys.argv[2]) * 2 ** 0.25 * 1.001 else 1)' "$initiator_p99" "$fio_p99" 2>/dev/null; then
  ok "BREAD p99: initiator end to end $(printf '%.1f' "$initiator_p99") µs (Prometheus, $breads requests) <= fio read latency $fio_p99 µs ($fio_reads reads) within a bucket; fio/initiator = $(python3 -c 'import sys; print(f"{float(sys.argv[2]) / float(sys.argv[1]):.2f}")' "$initiator_p99" "$fio_p99")"
else
  bad "BREAD p99: initiator end to end $initiator_p99 µs exceeds fio's read latency p99 $fio_p99 µs by more than a bucket"
fi

step "summary"
echo "monitoring tests ran $(($(date +%s) - started)) s"
if [ "$failures" = 0 ]; then echo "monitoring tests: passed"; else echo "monitoring tests: $failures FAILED"; exit 1; fi
