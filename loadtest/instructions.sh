#!/usr/bin/env bash
# Instructions the proxy executes per request, counted by callgrind: a
# measure the host's noise does not move (CPU per request here swings by
# ±20 % between rounds; the same binary counted twice agrees within 0.5 %,
# within 2 % where the connections opened vary, as in loki-new-connection).
# It counts user space only: the kernel's half of the proxy's CPU (the same
# system calls per request) is not in it, nor the wake-ups between threads
# (valgrind runs one thread at a time). See docs/benchmarks.md.
#
#   loadtest/instructions.sh [PROXY_BINARY] [SCENARIO] [ROW]
#
# defaults: target/release/tenant-proxy, loki-query-range, proxy (ROW is
# loadtest's --only, e.g. proxy+first-seen). Needs valgrind
# (Debian: apt-get install valgrind) and `cargo build --release -p loadtest`.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=$(realpath "${1:-target/release/tenant-proxy}")
scenario=${2:-loki-query-range}
row=${3:-proxy}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# loadtest starts the proxy through this wrapper, so callgrind sees the
# whole process; it writes its counts when the proxy exits.
printf '#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file=%s/counts "%s" "$@"\n' \
  "$work" "$binary" > "$work/proxy"
chmod +x "$work/proxy"

# One run, printed as "instructions requests". Requests are the calls into
# `RouteTable::classify` (every request is classified once), summed over
# its callers.
run() {
  rm -f "$work/counts"
  timeout 300 target/release/loadtest "loadtest/scenarios/$scenario.yaml" \
    --proxy-bin "$work/proxy" --only "$row" --duration "$1" > /dev/null 2> "$work/loadtest.err" ||
    { cat "$work/loadtest.err" >&2; return 1; }
  callgrind_annotate --tree=caller --threshold=100 "$work/counts" 2> /dev/null | awk '
    /PROGRAM TOTALS/ && !total { total = $1; gsub(",", "", total) }
    { line[NR] = $0 }
    $0 ~ /\*  \?\?\?:tenant_proxy::routes::(table::)?RouteTable::classify \[/ {
      for (i = NR - 1; i > 0 && line[i] ~ /</; i--)
        if (match(line[i], /\(([0-9,]+)x\)/)) {
          n = substr(line[i], RSTART + 1, RLENGTH - 3); gsub(",", "", n); calls += n }
    }
    END { print total, calls }'
}

# Two runs of different lengths: what does not grow with the requests
# (start-up, the CA roots, each credential's one argon2id verification and
# its 19 MiB of zeroed memory) cancels out in the difference.
read -r short_total short_requests < <(run 2s)
read -r long_total long_requests < <(run 6s)
echo "scenario=$scenario row=$row requests=$short_requests,$long_requests" \
  "instructions_per_request=$(((long_total - short_total) / (long_requests - short_requests)))"
