#!/usr/bin/env bash
# The fault matrix (tests/src/bin/chaos.rs): a real supervisor with mock sessions streaming
# long turns (several messages, tool calls, permission requests) and a reconnecting
# subscriber each; every round SIGKILLs, by a seeded choice, the supervisor (at a random
# moment or at a named fault point), an agentctl or an agent, and restarts what an operator
# would; one round in ten each is instead an edge of a session's life: a create, a stop or
# a delete cut short by a kill at its fault point, or a stop-all mid-turn. It prints a
# table (lost, duplicated, stuck, orphans, doubled agents) and fails unless every column is
# zero.
#
#   scripts/chaos.sh                      # 20 rounds (what CI runs, through scripts/test.sh)
#   scripts/chaos.sh --rounds 1000        # the long run
#   scripts/chaos.sh --sessions 5 --seed 7
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --workspace --bins
exec target/debug/chaos "$@"
