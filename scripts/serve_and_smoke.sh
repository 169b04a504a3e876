#!/usr/bin/env bash
# Check a machine (a Mac, usually): what it has, then serve the chosen model, smoke-test it, stop.
#   scripts/serve_and_smoke.sh [MODEL] [PORT]        e.g. scripts/serve_and_smoke.sh qwen3-4b 8080
# Exit code: 0 when every required smoke check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-demo}"
port="${2:-8080}"
uv run localchat doctor --base-url "http://127.0.0.1:${port}/v1"
exec uv run localchat serve --model "$model" --port "$port" --smoke
