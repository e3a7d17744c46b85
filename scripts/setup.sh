#!/usr/bin/env bash
# Idempotent setup for the test suite. Safe to run again and again; each step checks first.
#  - a Docker engine: when none is reachable and we are root, install Debian's docker.io and
#    start dockerd (readiness is its "API listen on" log line, not a polling loop);
#  - elizacp, the ACP agent nobody here wrote, from crates.io;
#  - real agents from npm, pinned, into the prefix .tools/npm (`.tools` links to a directory
#    this machine's checkouts share: see tools_dir) (Node.js from
#    Debian when it is missing and we are root);
#  - the Python ACP SDK (PyPI `agent-client-protocol`, pinned) in a project-local venv,
#    .tools/python, whose client drives `supervisor acp` in the face tests;
#  - real agents from PyPI, pinned, each in a venv of its own under .tools/ (fast-agent in
#    .tools/fast-agent, kimi in .tools/kimi), made with the newest Python 3.12 or newer found
#    (on PATH or pyenv's); without one they are skipped, saying so in .tools/<venv>.skipped;
#  - chromium and chromium-driver from Debian, for the web UI's browser tests;
#  - Debian's openssh-server (sshd; not started: the ssh:// engine test runs its own on a
#    loopback port with keys it makes);
#  - a second Docker engine for the multi-engine tests (issue 17): dockerd on
#    tcp://127.0.0.1:23750 (loopback only) with its own data root, exec root, pid file and
#    bridge (tether-br2), under $TMPDIR/tether-engine2.
# Prints what it did. scripts/test.sh sources it for DOCKERD_STARTED and
# SECOND_DOCKERD_STARTED (engines it started, to stop after); it exports
# TETHER_SECOND_DOCKER_HOST when the second engine is up.
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

SECOND_ENGINE_HOST=tcp://127.0.0.1:23750

ensure_second_engine() {
  SECOND_DOCKERD_STARTED=""
  if command -v docker >/dev/null 2>&1 && DOCKER_HOST=$SECOND_ENGINE_HOST docker info >/dev/null 2>&1; then
    log "second Docker engine reachable at $SECOND_ENGINE_HOST"
    export TETHER_SECOND_DOCKER_HOST=$SECOND_ENGINE_HOST
    return 0
  fi
  if [ "$(id -u)" != 0 ] || ! command -v dockerd >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1; then
    log "no second Docker engine (it needs root, dockerd and ip): multi-engine tests will be skipped (or fail with REQUIRE_DOCKER=1)"
    return 0
  fi
  local root=${TMPDIR:-/tmp}/tether-engine2
  mkdir -p "$root/data" "$root/exec"
  # Its own bridge, so its containers' network does not collide with the first engine's.
  if ! ip link show tether-br2 >/dev/null 2>&1; then
    ip link add name tether-br2 type bridge
    ip addr add 172.31.250.1/24 dev tether-br2
  fi
  ip link set tether-br2 up
  if [ -f "$root/dockerd.pid" ] && ! kill -0 "$(cat "$root/dockerd.pid")" 2>/dev/null; then
    log "removing stale $root/dockerd.pid"
    rm -f "$root/dockerd.pid"
  fi
  : > "$root/dockerd.log"
  log "starting a second dockerd on $SECOND_ENGINE_HOST (log: $root/dockerd.log)"
  setsid dockerd --host "$SECOND_ENGINE_HOST" --data-root "$root/data" --exec-root "$root/exec" \
    --pidfile "$root/dockerd.pid" --bridge tether-br2 >"$root/dockerd.log" 2>&1 < /dev/null &
  SECOND_DOCKERD_STARTED=$!
  if ! await_log_line "$root/dockerd.log" "API listen on" 120; then
    log "the second dockerd did not come up; its log:"
    tail -n 30 "$root/dockerd.log" >&2 || true
    return 1
  fi
  export TETHER_SECOND_DOCKER_HOST=$SECOND_ENGINE_HOST
  log "second Docker engine started"
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

# Where the installed tools live: `.tools` in the checkout, a link to a directory this
# machine's checkouts share (TETHER_TOOLS_CACHE, default ~/.cache/tether/tools), so a fresh
# clone reuses what an earlier one installed, as cargo reuses its registry. A checkout with
# a `.tools` directory of its own keeps it. Prints the directory, resolved: venvs record
# their absolute path, which must outlive the clone that made them.
tools_dir() {
  local root=$1 cache="${TETHER_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether/tools}"
  if [ ! -e "$root/.tools" ] && [ ! -L "$root/.tools" ]; then
    mkdir -p "$cache"
    ln -s "$cache" "$root/.tools"
  fi
  readlink -f "$root/.tools"
}

# Real agents, pinned: the versions the real-agent tests were written against.
REAL_AGENTS=("@agentclientprotocol/claude-agent-acp@0.101.0" "opencode-ai@1.18.33" "@agentclientprotocol/codex-acp@2.6.0" "@google/gemini-cli@0.61.0"
  "@qwen-code/qwen-code@0.15.10" "@github/copilot@1.0.102" "@augmentcode/auggie@0.36.0")
# With them in the same prefix: axe-core, the page's accessibility check in the browser tests,
# and TypeScript's checker, the page's type check (scripts/test.sh; nothing is compiled).
NPM_TOOLS=("${REAL_AGENTS[@]}" "axe-core@4.14.1" "typescript@5.9.3")

ensure_real_agents() {
  local root prefix
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  prefix="$(tools_dir "$root")/npm"
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
  for spec in "${NPM_TOOLS[@]}"; do
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

# Installs Debian packages (the arguments after the first two) for WHAT ($1) unless the
# test $2 says it is there; only as root (otherwise the tests that need it say so).
apt_ensure() {
  local what=$1 present=$2
  shift 2
  if eval "$present"; then
    log "$what present"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    log "no $what and not root: the tests that need it will be skipped (or fail with REQUIRE_DOCKER=1)"
    return 0
  fi
  log "installing $what from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "$@" >/dev/null
}

# The Python ACP SDK, pinned: a client we did not write, for `supervisor acp`.
PYTHON_ACP="agent-client-protocol==0.12.1"

ensure_python_acp() {
  local root venv
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv="$(tools_dir "$root")/python"
  if [ -x "$venv/bin/python" ] &&
    [ "$("$venv/bin/pip" show agent-client-protocol 2>/dev/null | sed -n 's/^Version: //p')" = "${PYTHON_ACP##*==}" ]; then
    log "$PYTHON_ACP present in $venv"
    return 0
  fi
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt_ensure "python3-venv" 'python3 -c "import venv, ensurepip" 2>/dev/null' python3-venv
  fi
  log "installing $PYTHON_ACP into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$PYTHON_ACP"
}

# Real agents from PyPI, pinned: venv directory under .tools, the package, and its version.
PYTHON_AGENTS=("fast-agent fast-agent-mcp 0.10.48" "kimi kimi-cli 1.51.0")

# The newest Python 3.12 or newer on this machine: python3.N on PATH, python3 itself, or
# one of pyenv's versions (whichever patch versions are installed). Prints its path.
find_python312() {
  local candidates=() best="" best_minor=0 python minor
  for minor in 15 14 13 12; do
    candidates+=("$(command -v "python3.$minor" 2>/dev/null || true)")
  done
  candidates+=("$(command -v python3 2>/dev/null || true)")
  candidates+=("${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*/bin/python3)
  for python in "${candidates[@]}"; do
    [ -n "$python" ] && [ -x "$python" ] || continue
    minor=$("$python" -c 'import sys; print(sys.version_info[1] if sys.version_info[0] == 3 else 0)' 2>/dev/null) || continue
    if [ "$minor" -ge 12 ] && [ "$minor" -gt "$best_minor" ] &&
      "$python" -c 'import venv, ensurepip' 2>/dev/null; then
      best=$python best_minor=$minor
    fi
  done
  [ -n "$best" ] && echo "$best"
}

ensure_python_agents() {
  local root python="" entry dir package version venv tools
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  tools=$(tools_dir "$root")
  for entry in "${PYTHON_AGENTS[@]}"; do
    read -r dir package version <<<"$entry"
    venv="$tools/$dir"
    # pip's own record of the install: a dist-info directory named for the version.
    if compgen -G "$venv/lib/python3.*/site-packages/${package//-/_}-$version.dist-info" >/dev/null; then
      log "$package $version present in $venv"
      continue
    fi
    if [ -z "$python" ] && ! python=$(find_python312); then
      local why="no Python 3.12 or newer here (on PATH or in pyenv): $package is not installed"
      log "$why; its real-agent tests will be skipped"
      echo "$why" > "$tools/$dir.skipped"
      continue
    fi
    log "installing $package==$version into $venv (with $python)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$package==$version"
    rm -f "$tools/$dir.skipped"
  done
}

# A real browser for the UI tests: Debian's chromium and its WebDriver.
ensure_browser() {
  apt_ensure "chromium and chromedriver" '[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]' \
    chromium chromium-driver
}

# Node, for the page's unit tests (node --test on its ES modules' pure parts; no build
# step, no packages).
ensure_node() {
  apt_ensure "node" 'command -v node >/dev/null 2>&1' nodejs
}

# bubblewrap, which confines an agent whose profile asks for no network (its own network
# namespace); the sandbox tests run one.
ensure_bubblewrap() {
  apt_ensure "bubblewrap" 'command -v bwrap >/dev/null 2>&1' bubblewrap
}

# sshd, for the test of an engine reached over ssh:// (the test starts its own; nothing
# starts the package's service here).
ensure_sshd() {
  apt_ensure "sshd" '[ -x /usr/sbin/sshd ]' --no-install-recommends openssh-server
}

ensure_docker
ensure_second_engine
ensure_elizacp
ensure_real_agents
ensure_python_acp
ensure_python_agents
ensure_browser
ensure_node
ensure_bubblewrap
ensure_sshd
