#!/usr/bin/env bash
# Proves the environment of the README's first command (`bash scripts/demo.sh`): copies the repository's files
# into a scratch folder, builds the plain environment there (`scripts/setup.sh` without --test, its own .venv),
# checks that it holds no PyTorch, and runs a short `tempax generate` of the registered model with an empty
# tokenizer cache. `.ci/run` calls it after the test suite. Pass a folder to keep the scratch copy there.
set -euo pipefail
cd "$(dirname "$0")/.."
keep=${1:-}
scratch=${keep:-$(mktemp -d)}
mkdir -p "$scratch"
start=$(date +%s)
# The files a clone has (tracked and not ignored), as they are in this checkout.
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$scratch"
bash "$scratch/scripts/setup.sh"
if "$scratch/.venv/bin/python" -m pip list 2>/dev/null | grep -iE '^torch[[:space:]]'; then
  echo "plain environment check: FAILED: the plain environment has torch installed" >&2
  exit 1
fi
cache=$(mktemp -d)
out=$(cd "$scratch" && TEMPAX_CACHE="$cache" .venv/bin/tempax generate smollm2-135m-instruct \
  --prompt "What is 12 * 7?" --chat --temperature 0 --max-new-tokens 4 --json)
echo "$out"
"$scratch/.venv/bin/python" - "$out" <<'PY'
import json, sys
rows = [json.loads(line) for line in sys.argv[1].splitlines() if line.startswith("{")]
assert len(rows) == 1 and 1 <= len(rows[0]["token_ids"]) <= 4 and rows[0]["text"].strip(), rows
PY
rm -rf "$cache"
echo "plain environment check: passed (no torch; generate ran) in $(( $(date +%s) - start )) s"
if [ -z "$keep" ]; then rm -rf "$scratch"; fi
