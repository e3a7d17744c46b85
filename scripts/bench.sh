#!/usr/bin/env bash
# Benchmarks against DESIGN §12's targets, with real processes and a release build.
# Prints a table and writes target/bench.json. Numbers, not pass/fail.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release --workspace --bins
exec target/release/bench
