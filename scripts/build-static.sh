#!/usr/bin/env bash
# Builds statically linked binaries for container images: mock-agent today (agentctl joins
# it with the Docker runtime). Output: target/x86_64-unknown-linux-gnu/debug/.
# Static glibc linking needs no extra toolchain: `+crt-static` on the gnu target.
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS='-C target-feature=+crt-static' \
  cargo build --quiet --target x86_64-unknown-linux-gnu -p agents --bin mock-agent
echo "$PWD/target/x86_64-unknown-linux-gnu/debug/mock-agent"
