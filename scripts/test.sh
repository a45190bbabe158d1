#!/usr/bin/env bash
# Sets up the environment with test dependencies and runs the default test suite (slow tests excluded;
# run them with: .venv/bin/python -m pytest -m slow). Two workers that take each other's queued tests when they run
# out (`--dist worksteal`), so that a long test (up to ~50 s) queued late does not leave the other worker idle.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest -q -rs -n 2 --dist worksteal "$@"
