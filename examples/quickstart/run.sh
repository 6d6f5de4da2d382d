#!/usr/bin/env bash
# tenant-proxy quickstart, one command, one machine:
#   a receiver Prometheus, tenant-proxy in label mode in front of it, and two
#   agent-mode Prometheus instances pushing as tenants team-a and team-b
#   (team-a's agent claims team-b's namespace; the proxy overwrites it).
#   Then real requests through the proxy show that each tenant sees its own
#   series only, and what a rewritten query looks like.
#   With a `loki` binary on PATH (or LOKI_BIN=/path/to/loki), Loki runs too
#   and each tenant pushes and reads a log line through the proxy.
#
# Usage: examples/quickstart/run.sh            # keeps running until Ctrl-C
#        examples/quickstart/run.sh --check    # checks, then stops (CI)
# Needs: cargo; installs prometheus and curl from Debian's packages if missing.
#        examples/quickstart/run.sh --loki-config DIR HTTP_PORT GRPC_PORT
#                                               # prints the Loki config it runs
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# The Loki configuration, from the template beside this script.
loki_config() { # dir http_port grpc_port
  sed -e "s|@LOKI_DIR@|$1|g" -e "s|@LOKI_PORT@|$2|g" -e "s|@LOKI_GRPC_PORT@|$3|g" "$here/loki.yaml"
}
if [ "${1:-}" = "--loki-config" ]; then
  loki_config "$2" "$3" "$4"
  exit 0
fi

check=0
[ "${1:-}" = "--check" ] && check=1
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAILED: %s\n' "$*" >&2; exit 1; }

install_missing() {
  local missing=()
  command -v prometheus >/dev/null || missing+=(prometheus)
  command -v curl >/dev/null || missing+=(curl)
  [ ${#missing[@]} -eq 0 ] && return
  say "installing ${missing[*]} from Debian's packages"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# A free loopback port: bound and released by the kernel's choice.
free_port() {
  perl -MIO::Socket::INET -e 'print IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1:0")->sockport'
}

# Waits (at most $2 seconds) until the command in $1 succeeds.
wait_for() {
  local deadline=$((SECONDS + $2))
  until eval "$1" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
}

install_missing
say "building tenant-proxy (release)"
(cd "$root" && cargo build --release -q -p tenant-proxy)
proxy_bin="$root/target/release/tenant-proxy"

receiver_port=$(free_port); proxy_port=$(free_port); admin_port=$(free_port)
agent_a_port=$(free_port); agent_b_port=$(free_port)
loki_bin=${LOKI_BIN:-$(command -v loki || true)}

# Demo credentials, for this local run only.
declare -A password=([agent-a]=team-a-push-password [agent-b]=team-b-push-password [grafana-a]=team-a-read-password [grafana-b]=team-b-read-password)
hash() { printf '%s' "$1" | "$proxy_bin" hash-password; }

say "writing the tenants file"
cat > "$work/tenants.yaml" <<YAML
version: 1
tenants:
  - id: team-a
    namespaces: [team-a]
    users:
      - {username: agent-a, password_hash: "$(hash "${password[agent-a]}")", scopes: [metrics:write, logs:write]}
      - {username: grafana-a, password_hash: "$(hash "${password[grafana-a]}")", scopes: [metrics:read, logs:read]}
  - id: team-b
    namespaces: [team-b]
    users:
      - {username: agent-b, password_hash: "$(hash "${password[agent-b]}")", scopes: [metrics:write, logs:write]}
      - {username: grafana-b, password_hash: "$(hash "${password[grafana-b]}")", scopes: [metrics:read, logs:read]}
YAML

cat > "$work/proxy.yaml" <<YAML
listen: 127.0.0.1:$proxy_port
admin_listen: 127.0.0.1:$admin_port
tenants_file: tenants.yaml
metrics:
  upstream: http://127.0.0.1:$receiver_port
  mode: label
  label: namespace
YAML

if [ -n "$loki_bin" ]; then
  # Loki 3.x, single binary, multi-tenant (examples/quickstart/loki.yaml).
  loki_port=$(free_port); loki_grpc_port=$(free_port)
  printf 'logs:\n  upstream: http://127.0.0.1:%s\n' "$loki_port" >> "$work/proxy.yaml"
  mkdir -p "$work/loki"
  loki_config "$work/loki" "$loki_port" "$loki_grpc_port" > "$work/loki/loki.yaml"
  say "starting Loki ($loki_bin) on 127.0.0.1:$loki_port"
  "$loki_bin" -config.file="$work/loki/loki.yaml" >"$work/loki.log" 2>&1 &
  pids+=($!)
fi

say "starting the receiver Prometheus on 127.0.0.1:$receiver_port"
mkdir -p "$work/receiver"
printf 'global:\n  scrape_interval: 1h\n' > "$work/receiver/prometheus.yml"
(cd "$work/receiver" && exec prometheus --config.file=prometheus.yml --storage.tsdb.path=data \
  --web.listen-address=127.0.0.1:$receiver_port --web.enable-remote-write-receiver --log.level=warn) \
  >"$work/receiver.log" 2>&1 &
pids+=($!)
wait_for "curl -fs http://127.0.0.1:$receiver_port/-/ready" 30 || fail "receiver Prometheus did not start (see $work/receiver.log)"

say "starting tenant-proxy on 127.0.0.1:$proxy_port (admin 127.0.0.1:$admin_port)"
"$proxy_bin" --config "$work/proxy.yaml" >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_for "curl -fs http://127.0.0.1:$admin_port/readyz" 30 || fail "tenant-proxy did not start (see $work/proxy.log)"

start_agent() { # name port user external-namespace-or-empty
  local dir="$work/$1" external=""
  mkdir -p "$dir"
  [ -n "$4" ] && external="  external_labels: {namespace: $4}"
  cat > "$dir/prometheus.yml" <<YAML
global:
  scrape_interval: 2s
$external
scrape_configs:
  - job_name: $1
    static_configs: [{targets: ["127.0.0.1:$2"]}]
remote_write:
  - url: http://127.0.0.1:$proxy_port/api/v1/write
    basic_auth: {username: $3, password: ${password[$3]}}
    queue_config: {batch_send_deadline: 1s, min_backoff: 100ms, max_backoff: 2s, retry_on_http_429: true}
YAML
  (cd "$dir" && exec prometheus --enable-feature=agent --config.file=prometheus.yml --storage.agent.path=data \
    --storage.remote.flush-deadline=1s --web.listen-address=127.0.0.1:$2 --log.level=warn) >"$dir.log" 2>&1 &
  pids+=($!)
}
say "starting two agents: agent-a (claims namespace team-b!) and agent-b"
start_agent agent-a "$agent_a_port" agent-a team-b
start_agent agent-b "$agent_b_port" agent-b ""

query() { # user promql
  curl -fsS -u "$1:${password[$1]}" "http://127.0.0.1:$proxy_port/api/v1/query" --data-urlencode "query=$2"
}
say "waiting for both tenants' series to arrive through the proxy"
wait_for "query grafana-a 'up' | grep -q agent-a" 60 || fail "team-a's series did not arrive"
wait_for "query grafana-b 'up' | grep -q agent-b" 60 || fail "team-b's series did not arrive"

a=$(query grafana-a 'up'); b=$(query grafana-b 'up')
say "team-a asks for 'up':"; echo "$a"
say "team-b asks for 'up':"; echo "$b"
say "what the proxy forwarded for team-a's 'sum by (job) (rate(prometheus_http_requests_total[1m]))':"
"$proxy_bin" rewrite --config "$work/proxy.yaml" --user grafana-a 'sum by (job) (rate(prometheus_http_requests_total[1m]))'

checks=0
expect() { # description condition
  if eval "$2"; then echo "ok   - $1"; else echo "FAIL - $1"; checks=$((checks + 1)); fi
}
say "checks"
expect "team-a sees its agent's series" 'grep -q "\"job\":\"agent-a\"" <<<"$a"'
expect "team-a sees no series of team-b" '! grep -q "agent-b" <<<"$a"'
expect "team-b sees no series of team-a" '! grep -q "agent-a" <<<"$b"'
expect "agent-a's claim on namespace team-b was overwritten" '! grep -q "\"namespace\":\"team-b\"" <<<"$a"'
expect "team-a cannot select team-b's namespace" '! query grafana-a "up{namespace=\"team-b\"}" | grep -q "\"job\""'
expect "admin endpoints are refused" '[ "$(curl -s -o /dev/null -w "%{http_code}" -u grafana-a:${password[grafana-a]} http://127.0.0.1:$proxy_port/api/v1/status/config)" = 404 ]'
expect "a wrong password is refused" '[ "$(curl -s -o /dev/null -w "%{http_code}" -u grafana-a:wrong http://127.0.0.1:$proxy_port/api/v1/query?query=up)" = 401 ]'

if [ -n "$loki_bin" ]; then
  wait_for "curl -fs http://127.0.0.1:$loki_port/ready" 120 || fail "Loki did not become ready (see $work/loki.log)"
  push_log() { # user line [extra curl args]
    local user=$1 line=$2; shift 2
    curl -fsS -u "$user:${password[$user]}" -H 'Content-Type: application/json' "$@" \
      --data "{\"streams\":[{\"stream\":{\"app\":\"quickstart\"},\"values\":[[\"$(date +%s%N)\",\"$line\"]]}]}" \
      "http://127.0.0.1:$proxy_port/loki/api/v1/push"
  }
  logs() { # user
    curl -fsS -G -u "$1:${password[$1]}" "http://127.0.0.1:$proxy_port/loki/api/v1/query_range" \
      --data-urlencode 'query={app="quickstart"}' --data-urlencode "start=$(( $(date +%s) - 600 ))000000000"
  }
  say "logs: each agent pushes a line through the proxy (agent-a sends X-Scope-OrgID: team-b)"
  push_log agent-a "hello from team-a" -H 'X-Scope-OrgID: team-b'
  push_log agent-b "hello from team-b"
  wait_for "logs grafana-a | grep -q 'hello from team-a'" 60 || fail "team-a's log line did not arrive"
  wait_for "logs grafana-b | grep -q 'hello from team-b'" 60 || fail "team-b's log line did not arrive"
  la=$(logs grafana-a); lb=$(logs grafana-b)
  expect "team-a reads its own log line" 'grep -q "hello from team-a" <<<"$la"'
  expect "team-a reads no line of team-b" '! grep -q "hello from team-b" <<<"$la"'
  expect "team-b reads no line of team-a (its spoofed header was replaced)" '! grep -q "hello from team-a" <<<"$lb"'
else
  echo "note: no loki binary on PATH (or LOKI_BIN): the logs part is skipped"
fi

[ $checks -eq 0 ] || fail "$checks check(s) failed"
if [ $check -eq 1 ]; then
  say "all checks passed"
  exit 0
fi

cat <<TEXT

== running. Point a Grafana at it:
   Prometheus datasource URL  http://127.0.0.1:$proxy_port   (HTTP method POST)
   Loki datasource URL        http://127.0.0.1:$proxy_port   (only with a loki binary)
   team-a: user grafana-a  password ${password[grafana-a]}
   team-b: user grafana-b  password ${password[grafana-b]}
   proxy metrics              http://127.0.0.1:$admin_port/metrics
   files and logs             $work
Ctrl-C stops everything this script started.
TEXT
wait
