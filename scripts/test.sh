#!/usr/bin/env bash
# Sets up the environment with test dependencies and runs the default test suite (slow tests excluded;
# run them with: .venv/bin/python -m pytest -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest -q -rs -n 2 "$@"
