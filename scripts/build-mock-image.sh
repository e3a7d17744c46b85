#!/usr/bin/env bash
# Builds the `tether-mock-agent:latest` image the built-in `mock` profile names for the
# Docker runtime: FROM scratch with the statically linked mock-agent. Offline: no registry
# is involved. Prints the image name.
set -euo pipefail
cd "$(dirname "$0")/.."
static_dir=$(scripts/build-static.sh)
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$static_dir/mock-agent" "$context/mock-agent"
printf 'FROM scratch\nCOPY mock-agent /usr/local/bin/mock-agent\nENV PATH=/usr/local/bin\n' > "$context/Dockerfile"
DOCKER_BUILDKIT=0 docker build --quiet -t tether-mock-agent:latest "$context" > /dev/null
echo tether-mock-agent:latest
