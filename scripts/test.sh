#!/usr/bin/env bash
# The test command: sets up what the tests need (idempotently), builds the workspace's
# binaries and the static ones for container images, then runs every test.
#
#   scripts/test.sh                 # Docker tests skip (visibly) without an engine
#   REQUIRE_DOCKER=1 scripts/test.sh  # ... and fail instead (CI)
#   CHAOS_ROUNDS=100 scripts/test.sh   # a longer fault matrix (default 20 rounds)
#
# Extra arguments go to the test runner (e.g. a filter).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/setup.sh
# What a test process that died without cleaning up left running (its daemon, sidecars,
# agents, browser), found by the harness's mark on their directory, is killed and named.
reap_orphans() {
  if [ -x target/debug/reap-orphans ]; then target/debug/reap-orphans; fi
}
# The engines we started, we stop when the tests are done.
stop_engines() {
  reap_orphans || true
  for pid in ${SECOND_DOCKERD_STARTED:-} ${DOCKERD_STARTED:-}; do
    kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  done
}
trap stop_engines EXIT

echo "test: building workspace binaries"
cargo build --quiet --workspace --bins
# The official ACP SDK's client (a package outside the workspace: it pins an older ACP schema
# crate than Tether's), sharing the target dir.
reap_orphans
echo "test: building the SDK client (tests/sdk-baseline)"
CARGO_TARGET_DIR="$PWD/target" cargo build --quiet --manifest-path tests/sdk-baseline/Cargo.toml
echo "test: building static binaries for container images"
static_dir=$(scripts/build-static.sh)
export TETHER_STATIC_MOCK_AGENT="$static_dir/mock-agent"
export TETHER_STATIC_AGENTCTL="$static_dir/agentctl"
# Built above: the tests need not build them again (a plain `cargo test` does).
export TETHER_TEST_BINS_BUILT=1

# The page's unit tests (its ES modules' pure parts, with Node's own test runner).
if command -v node >/dev/null 2>&1; then
  echo "test: the page's unit tests (node --test)"
  node --test supervisor/src/web/tests/
  tsc=$(tools_dir "$PWD")/npm/node_modules/.bin/tsc
  if [ -x "$tsc" ]; then
    echo "test: the page's type check (tsc over its ES modules)"
    "$tsc" -p supervisor/src/web
  elif [ -n "${REQUIRE_DOCKER:-}" ]; then
    echo "test: no tsc for the page's type check (scripts/setup.sh installs it)" >&2
    exit 1
  fi
elif [ -n "${REQUIRE_DOCKER:-}" ]; then
  echo "test: no node for the page's unit tests (scripts/setup.sh installs it as root)" >&2
  exit 1
else
  echo "test: the page's unit tests skipped: no node"
fi

# The fault matrix first, with a small round count (scripts/chaos.sh --rounds 1000 is the
# long run); the test runner's summary stays the last word.
echo "test: fault matrix (${CHAOS_ROUNDS:-20} rounds)"
target/debug/chaos --rounds "${CHAOS_ROUNDS:-20}"

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
