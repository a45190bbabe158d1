#!/usr/bin/env bash
# Runs one command on a TPU machine (no network, its own JAX and package index) in a copy of this checkout that
# carries .tpu/ from scripts/tpu/prepare.sh. The guide: docs/tpu.md.
#
#   bash scripts/tpu/run.sh tempax grpo --config recipes/grpo_gsm8k_smollm2.yaml task.source=.tpu/data/gsm8k
#   bash scripts/tpu/run.sh python bench/grpo_step.py --one small
#   bash scripts/tpu/run.sh notebook examples/grpo_gsm8k.ipynb   # its cells in order, no kernel, chip sizes
#   bash scripts/tpu/run.sh assemble-model    # check the model's parts; assemble it once all are here
#   bash scripts/tpu/run.sh install           # only install (every other form does it first when needed)
#   bash scripts/tpu/run.sh tunix python bench/tpu_tunix.py   # a command with Tunix's install instead of tempax's
#
# The first call on a machine installs tempax's dependencies from the carried wheels and the machine's index into
# .tpu/site-a (everything but the tokenizer path) and .tpu/site-b (transformers, huggingface-hub and what they
# need); .tpu/installed records what was installed, and later calls on the same warm machine skip it. Python's
# path is: the checkout, the machine's own PYTHONPATH and site-packages (its JAX first), .tpu/site-b, .tpu/site-a, and
# .tpu/model/packages (where the assembled model is found by its registered name, smollm2-135m-instruct).
# TEMPAX_CACHE is .tpu/cache, so compiled programs and tokenizers outlive a call while the machine is warm.
# Every call also assembles the model when its last part has arrived, and says which parts are still missing.
#
# `tunix COMMAND...` runs the command with Tunix (the JAX peer, bench/tpu_tunix.py) instead: the first such call on
# a machine installs scripts/tpu/tunix.txt from the carried .tpu/tunix-wheels (scripts/tpu/prepare.sh --tunix) and
# the index into .tpu/site-tunix, once (.tpu/tunix-installed), and Python's path is the checkout, the machine's own
# PYTHONPATH and site-packages, and .tpu/site-tunix only: Tunix's safetensors < 0.8 never meets tempax's >= 0.8.
# tempax's dependencies need not be installed for it, and its other calls never see .tpu/site-tunix.
#
# Environment: TPU_PYTHON (default: python3 or python, the one with JAX), TPU_INDEX (default
# file:///opt/pypi/simple), TPU_DIR (default .tpu), TEMPAX_CACHE, TEMPAX_NOTEBOOK_SIZE (notebook: default chip).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TPU="${TPU_DIR:-$ROOT/.tpu}"
INDEX="${TPU_INDEX:-file:///opt/pypi/simple}"
CARRY="$ROOT/scripts/tpu/carry.py"

usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

find_python() {
  if [ -n "${TPU_PYTHON:-}" ]; then echo "$TPU_PYTHON"; return; fi
  for candidate in python3 python; do
    if command -v "$candidate" > /dev/null &&
        "$candidate" -c 'import importlib.util, sys; sys.exit(not importlib.util.find_spec("jax"))'; then
      command -v "$candidate"
      return
    fi
  done
  echo "run.sh: no python3 or python with JAX on this machine; set TPU_PYTHON" >&2
  exit 2
}

machine_path() {
  # The machine's own PYTHONPATH (where its JAX may live) and site-packages, which stay ahead of ours.
  local machine
  machine="$(env -u PYTHONPATH "$PY" -c 'import sys; print(":".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))')"
  echo "${MACHINE_PYTHONPATH:+$MACHINE_PYTHONPATH:}$machine"
}

set_environment() {
  export PYTHONPATH="$ROOT:$(machine_path):$TPU/site-b:$TPU/site-a:$TPU/model/packages"
  export TEMPAX_CACHE="${TEMPAX_CACHE:-$TPU/cache}"
  export TEMPAX_BENCH_SHARED="${TEMPAX_BENCH_SHARED:-$TPU/data/bench}"
  export GSM8K_DIR="${GSM8K_DIR:-$TPU/data/gsm8k}"
  mkdir -p "$TPU/bin" "$TEMPAX_CACHE"
  printf '#!/bin/sh\nexec "%s" -m tempax.cli.main "$@"\n' "$PY" > "$TPU/bin/tempax"
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" > "$TPU/bin/python"
  chmod +x "$TPU/bin/tempax" "$TPU/bin/python"
  export PATH="$TPU/bin:$PATH"
}

set_tunix_environment() {
  # Tunix's folder alone after the machine's: none of tempax's installed folders, no tempax command.
  export PYTHONPATH="$ROOT:$(machine_path):$TPU/site-tunix"
  export TEMPAX_BENCH_SHARED="${TEMPAX_BENCH_SHARED:-$TPU/data/bench}"
  mkdir -p "$TPU/tunix-bin"
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" > "$TPU/tunix-bin/python"
  chmod +x "$TPU/tunix-bin/python"
  export PATH="$TPU/tunix-bin:$PATH"
}

install_tunix() {
  local key list="$ROOT/scripts/tpu/tunix.txt"
  key="$(env -u PYTHONPATH "$PY" "$CARRY" list-stamp-key "$list" "$INDEX")"
  if [ -f "$TPU/tunix-installed" ] && [ "$(cat "$TPU/tunix-installed")" = "$key" ] && [ -d "$TPU/site-tunix" ]; then
    return 0
  fi
  if [ ! -d "$TPU/tunix-wheels" ]; then
    echo "run.sh: Tunix is not installed on this machine (a fresh machine, or scripts/tpu/tunix.txt changed): carry" \
      ".tpu/tunix-wheels in this call (bash scripts/tpu/prepare.sh --tunix makes it)" >&2
    exit 2
  fi
  echo "run.sh: installing Tunix (scripts/tpu/tunix.txt) into $TPU/site-tunix (once while this machine is warm)"
  local started=$SECONDS
  rm -rf "$TPU/site-tunix.tmp"
  # --no-deps: exactly the listed distributions (google-tunix's own requirement list names packages with no
  # wheel and packages its workloads never import); the machine keeps its JAX.
  env -u PYTHONPATH "$PY" -m pip install -q --isolated --no-input --disable-pip-version-check --no-deps \
    --only-binary=:all: --index-url "$INDEX" --find-links "$TPU/tunix-wheels" --target "$TPU/site-tunix.tmp" \
    -r "$list"
  rm -rf "$TPU/tunix-installed" "$TPU/site-tunix"
  mv "$TPU/site-tunix.tmp" "$TPU/site-tunix"
  if ! (set_tunix_environment && "$PY" "$CARRY" check-list "$list"); then
    echo "run.sh: Tunix's install does not give the listed versions (above); nothing recorded as installed" >&2
    exit 2
  fi
  echo "$key" > "$TPU/tunix-installed"
  echo "run.sh: installed Tunix in $((SECONDS - started)) s"
}

install() {
  local key
  key="$(env -u PYTHONPATH "$PY" "$CARRY" stamp-key "$ROOT/pyproject.toml" "$ROOT/scripts/tpu/wheels.txt" "$INDEX")"
  if [ -f "$TPU/installed" ] && [ "$(cat "$TPU/installed")" = "$key" ] && [ -d "$TPU/site-a" ] && [ -d "$TPU/site-b" ]; then
    return 0
  fi
  if [ ! -d "$TPU/wheels" ]; then
    echo "run.sh: tempax's dependencies are not installed on this machine (a fresh machine, or pyproject.toml or" \
      "scripts/tpu/wheels.txt changed): carry .tpu/wheels in this call (call 1 of what scripts/tpu/prepare.sh printed)" >&2
    exit 2
  fi
  echo "run.sh: installing tempax's dependencies into $TPU/site-a and site-b (once while this machine is warm)"
  local started=$SECONDS first second
  rm -rf "$TPU/site-a.tmp" "$TPU/site-b.tmp"  # a working install stays until the new one is complete
  mapfile -t first < <(env -u PYTHONPATH "$PY" "$CARRY" requirements "$ROOT/pyproject.toml" first)
  mapfile -t second < <(env -u PYTHONPATH "$PY" "$CARRY" requirements "$ROOT/pyproject.toml" second)
  # --target installs every dependency afresh (the machine's JAX too, shadowed by its own copy on the path).
  local pip=(env -u PYTHONPATH "$PY" -m pip install -q --isolated --no-input --disable-pip-version-check
             --only-binary=:all: --index-url "$INDEX" --find-links "$TPU/wheels")
  "${pip[@]}" --target "$TPU/site-a.tmp" "${first[@]}"
  "${pip[@]}" --target "$TPU/site-b.tmp" "${second[@]}"
  rm -rf "$TPU/installed" "$TPU/site-a" "$TPU/site-b"
  mv "$TPU/site-a.tmp" "$TPU/site-a"
  mv "$TPU/site-b.tmp" "$TPU/site-b"
  set_environment
  if ! "$PY" "$CARRY" check "$ROOT/pyproject.toml"; then
    echo "run.sh: the installed dependencies do not satisfy pyproject.toml (above); nothing recorded as installed" >&2
    exit 2
  fi
  echo "$key" > "$TPU/installed"
  echo "run.sh: installed in $((SECONDS - started)) s"
}

assemble_model() {
  # Quiet when there is no model folder; otherwise one line: the model's path, or the parts still missing.
  if [ -f "$TPU/model/manifest.json" ] || [ "${1:-}" = required ]; then
    env -u PYTHONPATH "$PY" "$CARRY" assemble "$TPU/model"
  fi
}

if [ $# -eq 0 ]; then
  usage >&2
  exit 2
fi
if [ "$1" = -h ] || [ "$1" = --help ]; then
  usage
  exit 0
fi
PY="$(find_python)"
MACHINE_PYTHONPATH="${MACHINE_PYTHONPATH-${PYTHONPATH:-}}"
case "$1" in
  assemble-model)
    assemble_model required
    ;;
  install)
    install
    set_environment
    ;;
  tunix)
    if [ $# -lt 2 ]; then echo "run.sh: tunix takes a command, e.g. tunix python bench/tpu_tunix.py" >&2; exit 2; fi
    shift
    install_tunix
    set_tunix_environment
    exec "$@"
    ;;
  notebook)
    if [ $# -ne 2 ]; then echo "run.sh: notebook takes one .ipynb path, e.g. examples/grpo_gsm8k.ipynb" >&2; exit 2; fi
    install
    set_environment
    assemble_model || true
    export TEMPAX_NOTEBOOK_SIZE="${TEMPAX_NOTEBOOK_SIZE:-chip}"
    exec "$PY" "$ROOT/scripts/tpu/run_notebook.py" "$2"
    ;;
  *)
    install
    set_environment
    assemble_model || true  # a missing part is reported; the command may not need the model
    exec "$@"
    ;;
esac
