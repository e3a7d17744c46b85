#!/usr/bin/env bash
# Benchmarks against DESIGN §12's and issue 13's targets, with real processes and a release
# build. Prints a table and writes target/bench.json. Numbers, not pass/fail: each figure is
# the min / median of 3 runs, and the relay is set beside two baselines measured in the
# same run (fast-agent read from a pipe, and the official ACP SDK client, tests/sdk-baseline).
#
#   scripts/bench.sh               # every section
#   scripts/bench.sh relay scale   # some: relay sessions scale restart docker context workflows page review lists
#                                  # usage warm idle face sandbox checkpoint
set -euo pipefail
cd "$(dirname "$0")/.."

# The Docker section needs an engine (started here when there is none, and stopped after).
source scripts/setup.sh
stop_engines() {
  for pid in ${SECOND_DOCKERD_STARTED:-} ${DOCKERD_STARTED:-}; do
    kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  done
}
trap stop_engines EXIT

cargo build --quiet --release --workspace --bins
# The SDK baseline is a package of its own (outside the workspace, so the tests never build
# it), sharing the target dir.
CARGO_TARGET_DIR="$PWD/target" cargo build --quiet --release --manifest-path tests/sdk-baseline/Cargo.toml
static_dir=$(scripts/build-static.sh)
export TETHER_STATIC_MOCK_AGENT="$static_dir/mock-agent"
export TETHER_STATIC_AGENTCTL="$static_dir/agentctl"
# The restart sections wait for the daemon's "re-attaching done" line (an info line of the
# recovery); the rest of its log stays at warn.
export TETHER_TEST_LOG="${TETHER_TEST_LOG:-warn,supervisor::service=info}"
target/release/bench "$@"
