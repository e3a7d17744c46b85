#!/usr/bin/env bash
# Builds the statically linked binaries that go into containers: agentctl (bind-mounted
# as every container's entrypoint by the Docker runtime) and mock-agent (for the test
# image). Output: target/x86_64-unknown-linux-gnu/debug/{agentctl,mock-agent}; prints the
# directory. Static glibc linking needs no extra toolchain: `+crt-static` on the gnu target.
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS='-C target-feature=+crt-static' \
  cargo build --quiet --target x86_64-unknown-linux-gnu -p agents --bin mock-agent -p agentctl --bin agentctl
echo "$PWD/target/x86_64-unknown-linux-gnu/debug"
