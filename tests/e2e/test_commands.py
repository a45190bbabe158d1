"""Every documented command that runs to its end on its own: one `Case` a line (tests/e2e/cases.py says what each
checks). The commands that need a process watched while it runs (serve, Ray workers, signals) are in
test_runs.py; the shared SFT and reward-model runs in conftest.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.documented_commands import README, ROOT, code_block
from tests.e2e.cases import (SMALL_TRAIN, TRACEBACK, Case, children_cpu_s, fill, read_metrics, run_case, tail,
                             user_env)

pytestmark = pytest.mark.e2e

GRPO_SMALL = "grpo.group_size=2 grpo.max_new_tokens=16 eval.num_problems=2 eval.max_new_tokens=16 train.batch_size=1"
DEMO_STAGES = ("--steps 1 --sft-steps 1 --eval-problems 4 --run-dir {tmp}/demo grpo.grpo.group_size=2 "
               "grpo.grpo.max_new_tokens=16 grpo.train.batch_size=1 sft.train.batch_size=2")
DEMO_SMALL = f"{DEMO_STAGES} sft.train.seq_len=128"
# --compare's other rows train on 4 worked solutions: 2 rows a step of 128 tokens, RFT sampling 2 x 2 short answers,
# one step each (their `train.steps` is an upper bound under GRPO's seconds, which here are mostly compilation).
COMPARE_SMALL = (f"--demonstrations 4 {DEMO_SMALL} " + " ".join(
    f"{stage}.train.batch_size=2 {stage}.train.seq_len=128 {stage}.train.steps=1"
    for stage in ("scarce_sft", "baseline", "rft"))
    + " rft.rft.group_size=2 rft.rft.problems_per_round=2 rft.rft.sampling_batch=2 rft.rft.max_new_tokens=16"
    + " rft.rft.threshold=0 rft.rft.keep_truncated=true")  # a 1-step warm-start: no full score, no stop in 16
DEMO_TABLE = r"after GRPO"
# rft.threshold=0 keeps every sample: a 2-step run from a model that does not know the format yet keeps none at 2.0.
RFT_SMALL = ("rft.threshold=0 rft.group_size=2 rft.problems_per_round=2 rft.sampling_batch=2 rft.max_new_tokens=16 "
             "eval.max_new_tokens=16 train.batch_size=2 train.seq_len=128")
PAIRS_SMALL = f"{SMALL_TRAIN} data.max_rows=4 data.max_eval_rows=4"
README_EXPORT, README_GGUF = "tempax export RUN_DIR OUT_DIR", "tempax export RUN_DIR MODEL.gguf --quant q8_0"

CASES = [
    Case("tempax demo [--steps N --sft-steps N --task arithmetic|gsm8k --source ../shared/data/gsm8k --model SOURCE "
         "--advantage grpo|rloo]",
         f"demo --task arithmetic --model smollm2-135m-instruct --advantage grpo {DEMO_SMALL}",
         expect=(DEMO_TABLE,), files=("{tmp}/demo",)),
    Case("tempax demo --compare --eval-problems 200",
         f"demo --compare {COMPARE_SMALL}", expect=(r"Held-out arithmetic problems", r"Scarce demonstrations:")),
    # (a) scored on 2 validation problems after its one step, then (d) GRPO from it for (b)'s seconds.
    Case("tempax demo --compare --eval-problems 200 validation_problems=100 rl_after_sft=true",
         f"demo --compare {COMPARE_SMALL} validation_problems=2 validation_every=1 rl_after_sft=true reference=false",
         expect=(r"\(a\) kept the weights of step 1", r"\(d\) GRPO after \(a\) minus \(a\)")),
    # Tool episodes are longer than 128 tokens: the tools demo keeps its warm-start's sequence length.
    Case("tempax demo --task arithmetic-tools --eval-problems 200",
         f"demo --task arithmetic-tools {DEMO_STAGES}", expect=(r"RL with tools", r"RL without tools")),
    Case("tempax model-info smollm2-135m-instruct", "model-info smollm2-135m-instruct", expect=(r"llama", r"30")),
    Case("tempax generate smollm2-135m-instruct --prompt \"What is 12 * 7?\" --n 2 --temperature 0.7",
         "generate smollm2-135m-instruct --prompt 'What is 12 * 7?' --n 2 --temperature 0.7 --max-new-tokens 8 --json",
         expect=(r'(?s)\{.*"text".*\n\{.*"text"',)),
    Case("tempax chat smollm2-135m-instruct", "chat smollm2-135m-instruct --max-new-tokens 8",
         stdin="What is 2 + 2?\n/exit\n", expect=(r"you>",)),
    Case("tempax pretrain --config recipes/pretrain_lora_smollm2_gsm8k.yaml",
         f"pretrain --config recipes/pretrain_lora_smollm2_gsm8k.yaml {SMALL_TRAIN} data.max_rows=16", steps=2),
    Case("tempax dpo --config recipes/dpo_smollm2_lora.yaml", f"dpo --config recipes/dpo_smollm2_lora.yaml {PAIRS_SMALL}",
         steps=2, files=("{run}/eval_summary.json",)),
    Case("tempax kto --config recipes/kto_smollm2_lora.yaml", f"kto --config recipes/kto_smollm2_lora.yaml {PAIRS_SMALL}",
         steps=2, files=("{run}/eval_summary.json",)),
    Case("tempax ppo --config recipes/ppo_hh_smollm2_lora.yaml",
         "ppo --config recipes/ppo_hh_smollm2_lora.yaml reward_model={rm} eval.num_prompts=2 ppo.max_new_tokens=8 "
         "ppo.max_prompt_len=64 ppo.epochs=1 ppo.mini_batches=1 train.batch_size=2 eval.batch_size=2", steps=2),
    Case("tempax score RUN_DIR/reward_model --input ../shared/data/hh-rlhf/test.jsonl.gz --limit 200",
         "score {rm}/reward_model --input ../shared/data/hh-rlhf/test.jsonl.gz --limit 4 --output {tmp}/scores.jsonl",
         files=("{tmp}/scores.jsonl",)),
    Case("tempax distill --config recipes/distill_smollm2.yaml",
         f"distill --config recipes/distill_smollm2.yaml {SMALL_TRAIN} data.max_rows=16 train.eval_at_start=false",
         steps=2, files=("{run}/student/config.json",)),
    # One RFT run for the guide's three lines: from the shared SFT run dir (the warm start), 2 steps.
    Case(("tempax rft --config recipes/rft_arithmetic_smollm2.yaml model.source=WARM_START_DIR",
          "tempax rft --config recipes/rft_arithmetic_smollm2.yaml",
          "tempax rft --config recipes/rft_arithmetic_smollm2.yaml train.steps=2 eval.num_problems=8"),
         f"rft --config recipes/rft_arithmetic_smollm2.yaml model.source={{sft}} train.steps=2 eval.num_problems=2 "
         f"{RFT_SMALL}", steps=2, metrics=("loss", "rft/accept_rate")),
    Case("tempax rft --describe", "rft --describe", expect=(r"rft\.group_size",)),
    Case("tempax eval SOURCE --task gsm8k --source ../shared/data/gsm8k",
         "eval {sft} --task gsm8k --source ../shared/data/gsm8k --limit 4 --max-new-tokens 16 --out {tmp}/eval.json",
         files=("{tmp}/eval.json",), expect=(r"answer acc", r"4 gsm8k problems")),
    Case("tempax data clean ../shared/data/gsm8k/train.jsonl OUT.jsonl --config examples/clean_sft.yaml",
         "data clean ../shared/data/gsm8k/train.jsonl {tmp}/OUT.jsonl --config examples/clean_sft.yaml",
         files=("{tmp}/OUT.jsonl",)),
    Case("tempax data stats ../shared/data/hh-rlhf-sft/train.jsonl --model smollm2-135m-instruct",
         "data stats ../shared/data/hh-rlhf-sft/train.jsonl --model smollm2-135m-instruct", expect=(r"tokens",)),
    Case("tempax tokenizer train ../shared/data/gsm8k/train.jsonl --vocab-size 8192 --out TOKENIZER_DIR",
         "tokenizer train ../shared/data/gsm8k/train.jsonl --vocab-size 8192 --out {tmp}/tokenizer",
         files=("{tmp}/tokenizer/tokenizer.json",)),
    Case("tempax recommend ../shared/data/hh-rlhf-sft --out recommended.yaml",
         "recommend ../shared/data/hh-rlhf-sft --out {tmp}/recommended.yaml", files=("{tmp}/recommended.yaml",)),
    Case("tempax launch --nproc 2 --devices-per-process 2 -- tempax sft --config recipes/sft_full_tiny.yaml "
         "train.mesh.fsdp=4", "launch --nproc 2 --devices-per-process 2 -- tempax sft --config recipes/sft_full_tiny.yaml "
         "train.mesh.fsdp=4 train.batch_size=4 train.seq_len=64 data.max_rows=64 train.log_every=1", steps=2),
    Case("tempax data episodes --config recipes/grpo_price_tools.yaml --policy examples/price_tools.py:scripted_reply "
         "--out runs/price_episodes.jsonl", "data episodes --config recipes/grpo_price_tools.yaml --policy "
         "examples/price_tools.py:scripted_reply --out {tmp}/episodes.jsonl --limit 4", files=("{tmp}/episodes.jsonl",),
         name="data-episodes-readme"),
    Case("tempax validate recipes/sft_lora_smollm2.yaml", "validate recipes/sft_lora_smollm2.yaml",
         expect=(r"ok: recipes/sft_lora_smollm2.yaml is a valid `tempax sft` recipe",)),
    Case("tempax plot RUN_DIR", "plot {sft}", files=("{sft}/plots/metrics.png",)),
    Case('tempax generate runs/my_sft --prompt "Say hello in French."',
         "generate {sft} --prompt 'Say hello in French.' --max-new-tokens 8", expect=(r"\S",), name="generate-run-dir"),
]

# The README's GRPO quick starts, with the reward file and the Python example read from the README itself: the
# command line with `my_rewards.py` written beside it (it also covers the recipe's plain line: same recipe, the
# arithmetic task), and the Python example run as a script, the tier's overrides after its own.
GRPO_QUICK_START = Case(
    ("tempax grpo --config recipes/grpo_gsm8k_smollm2.yaml",
     "tempax grpo --config recipes/grpo_gsm8k_smollm2.yaml task.name=arithmetic "
     "rewards.functions=[my_rewards.py:last_number_is_the_answer] rewards.weights=null"),
    "grpo --config recipes/grpo_gsm8k_smollm2.yaml task.name=arithmetic "
    f"rewards.functions=[{{tmp}}/my_rewards.py:last_number_is_the_answer] rewards.weights=null {GRPO_SMALL}",
    steps=2, metrics=("loss", "reward/total_mean"), name="grpo-readme-own-reward")
PYTHON_QUICK_START_OVERRIDES = ["train.steps=2", "train.run_dir={run}", *GRPO_SMALL.split()]

# Exports, each read back through tempax.load in a fresh process (tests/e2e/load_back.py); the next token of
# "The capital of France is" is checked where the weights are kept at 8 bits or more.
EXPORTS = [
    (Case((README_EXPORT, "tempax export runs/sft OUT_DIR"), "export {sft} {tmp}/out",
          files=("{tmp}/out/config.json", "{tmp}/out/README.md")), "{tmp}/out", " Paris"),
    (Case((README_GGUF, "tempax export runs/sft model.gguf --quant q8_0"), "export {sft} {tmp}/model.gguf --quant q8_0"),
     "{tmp}/model.gguf", " Paris"),
    (Case("tempax export runs/sft model.bin --gguf --quant q4_0", "export {sft} {tmp}/model.bin --gguf --quant q4_0"),
     "{tmp}/model.bin", None),
    (Case("tempax export smollm2-135m-instruct smollm2.f16.gguf", "export smollm2-135m-instruct {tmp}/smollm2.f16.gguf"),
     "{tmp}/smollm2.f16.gguf", " Paris"),
]

ADAPTERS = Case("tempax export runs/sft ADAPTERS_DIR --adapters", "export {sft} {tmp}/adapters --adapters",
                files=("{tmp}/adapters/adapter_config.json", "{tmp}/adapters/adapter_model.safetensors"))


def values_for(case: Case, tmp_path, request) -> dict[str, str]:
    values = {"tmp": str(tmp_path), "run": str(tmp_path / "run")}
    if "sft" in case.placeholders:
        values["sft"] = request.getfixturevalue("sft_run")["run_dir"]
    if "rm" in case.placeholders:
        values["rm"] = request.getfixturevalue("reward_model_run")["run_dir"]
    return values


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_documented_command(case, tmp_path, request, record):
    run_case(case, values_for(case, tmp_path, request), record)


def test_readme_grpo_quick_start_with_its_reward_file(tmp_path, record):
    (tmp_path / "my_rewards.py").write_text(code_block(README, "# my_rewards.py"))
    run_case(GRPO_QUICK_START, {"tmp": str(tmp_path), "run": str(tmp_path / "run")}, record)


def test_readme_python_quick_start(tmp_path, record):
    """The README's `tempax.train` example as a user saves and runs it; its last line prints the held-out
    answer accuracy before and after."""
    script = tmp_path / "grpo_own_reward.py"
    script.write_text(code_block(README, "import re"))
    values = {"tmp": str(tmp_path), "run": str(tmp_path / "run")}
    start, cpu = time.monotonic(), children_cpu_s()
    done = subprocess.run([sys.executable, str(script), *(fill(o, values) for o in PYTHON_QUICK_START_OVERRIDES)],
                          cwd=ROOT, env=user_env(), capture_output=True, text=True, timeout=600)
    record(time.monotonic() - start, children_cpu_s() - cpu)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and TRACEBACK not in output, tail(output)
    assert re.search(r"held-out answers: \d+\.\d% -> \d+\.\d%", done.stdout), tail(output)
    logged = [r["step"] for r in read_metrics(values["run"]) if "loss" in r and "reward/total_mean" in r]
    assert logged == [1, 2], f"{values['run']}/metrics.jsonl logged loss and reward at steps {logged}"


def load_back(path: str) -> dict:
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "e2e", "load_back.py"), path], cwd=ROOT,
                          env=user_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case,exported,next_token", EXPORTS, ids=[c.id for c, _, _ in EXPORTS])
def test_export_loads_back(case, exported, next_token, tmp_path, request, record):
    values = values_for(case, tmp_path, request)
    run_case(case, values, record)
    loaded = load_back(exported.format(**values))
    assert loaded["layers"] == 30 and loaded["vocab"] == 49152 and loaded["finite"], loaded
    if next_token is not None:
        assert loaded["next"] == next_token, loaded


def test_adapters_export_is_peft_layout(tmp_path, request, record):
    from safetensors import safe_open

    values = values_for(ADAPTERS, tmp_path, request)
    run_case(ADAPTERS, values, record)
    config = json.load(open(os.path.join(values["tmp"], "adapters", "adapter_config.json")))
    assert config["r"] == 16 and config["peft_type"] == "LORA", config
    with safe_open(os.path.join(values["tmp"], "adapters", "adapter_model.safetensors"), "np") as f:
        names = list(f.keys())
    assert any("lora_A" in n for n in names) and any("lora_B" in n for n in names), names[:5]
