#!/usr/bin/env bash
# Idempotent setup for the test suite. Safe to run again and again; each step checks first.
#  - a Docker engine: when none is reachable and we are root, install Debian's docker.io and
#    start dockerd (readiness is its "API listen on" log line, not a polling loop);
#  - elizacp, the ACP agent nobody here wrote, from crates.io;
#  - real agents from npm, pinned, into the project-local prefix .tools/npm (Node.js from
#    Debian when it is missing and we are root);
#  - chromium and chromium-driver from Debian, for the web UI's browser tests.
# Prints what it did. Exports nothing: scripts/test.sh sources it for DOCKERD_STARTED.
set -euo pipefail

log() { printf 'setup: %s\n' "$*"; }

docker_reachable() {
  command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1
}

# Waits for a line matching $2 in log file $1, for at most $3 seconds, by following the
# file (tail -F is woken by the kernel on each write): no sleep loop.
await_log_line() {
  local file=$1 pattern=$2 seconds=$3
  timeout "$seconds" grep -m1 -q -- "$pattern" < <(tail -n +1 -F "$file" 2>/dev/null)
}

ensure_docker() {
  DOCKERD_STARTED=""
  if docker_reachable; then
    log "Docker engine reachable"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    log "no Docker engine and not root: Docker tests will be skipped (or fail with REQUIRE_DOCKER=1)"
    return 0
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    log "installing docker.io from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq docker.io >/dev/null
  fi
  # A dockerd killed with its session leaves its pid file behind; drop it if stale.
  if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    log "removing stale /var/run/docker.pid"
    rm -f /var/run/docker.pid
  fi
  local dlog=${TMPDIR:-/tmp}/tether-dockerd.log
  : > "$dlog"
  log "starting dockerd (log: $dlog)"
  setsid dockerd >"$dlog" 2>&1 < /dev/null &
  DOCKERD_STARTED=$!
  if ! await_log_line "$dlog" "API listen on" 120; then
    log "dockerd did not come up; its log:"
    tail -n 30 "$dlog" >&2 || true
    return 1
  fi
  docker_reachable || { log "dockerd started but the engine is not reachable"; return 1; }
  log "Docker engine started"
}

find_elizacp() {
  command -v elizacp 2>/dev/null || { [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/elizacp" ] && echo "${CARGO_HOME:-$HOME/.cargo}/bin/elizacp"; }
}

ensure_elizacp() {
  if find_elizacp >/dev/null; then
    log "elizacp present: $(find_elizacp)"
    return 0
  fi
  log "installing elizacp from crates.io (cargo install --locked elizacp)"
  cargo install --quiet --locked elizacp
}

# Real agents, pinned: the versions the real-agent tests were written against.
REAL_AGENTS=("@agentclientprotocol/claude-agent-acp@0.101.0" "opencode-ai@1.18.33" "@agentclientprotocol/codex-acp@2.6.0" "@google/gemini-cli@0.61.0")

ensure_real_agents() {
  local root prefix
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  prefix="$root/.tools/npm"
  if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
      log "no npm and not root: real-agent tests will be skipped (or fail with REQUIRE_DOCKER=1)"
      return 0
    fi
    log "installing nodejs and npm from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq nodejs npm >/dev/null
  fi
  local missing=()
  for spec in "${REAL_AGENTS[@]}"; do
    local name=${spec%@*} version=${spec##*@}
    local manifest="$prefix/node_modules/$name/package.json"
    if [ -f "$manifest" ] && grep -q "\"version\": \"$version\"" "$manifest"; then
      log "$name $version present in $prefix"
    else
      missing+=("$spec")
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} into $prefix"
    mkdir -p "$prefix"
    npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "${missing[@]}" >/dev/null
  fi
}

# A real browser for the UI tests: Debian's chromium and its WebDriver.
ensure_browser() {
  if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    log "chromium and chromedriver present"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    log "no chromium/chromedriver and not root: UI tests will be skipped (or fail with REQUIRE_DOCKER=1)"
    return 0
  fi
  log "installing chromium and chromium-driver from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq chromium chromium-driver >/dev/null
}

ensure_docker
ensure_elizacp
ensure_real_agents
ensure_browser
