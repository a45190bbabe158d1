#!/usr/bin/env bash
# Sets up the environment and runs the main job: `tempax demo` (arguments are passed through).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tempax demo "$@"
