"""`tempax demo` and `tempax eval`: argument parsing, and a shortened demo end to end on a tiny model."""

from __future__ import annotations

import json
import os

import pytest

from tempax.cli.demo import DEFAULT_MODEL, DemoConfig, config_from_args, main
from tempax.cli.main import build_parser
from tempax.errors import ConfigError


def test_demo_takes_no_arguments_and_maps_its_flags():
    args = build_parser().parse_args(["demo"])
    cfg = config_from_args(args)
    assert cfg == DemoConfig()
    assert cfg.model.source == DEFAULT_MODEL and cfg.task == "arithmetic"
    args = build_parser().parse_args(["demo", "--steps", "2", "--sft-steps", "0", "--eval-problems", "8",
                                      "--run-dir", "/tmp/x", "--model", "preset:tiny-llama"])
    cfg = config_from_args(args)
    assert (cfg.steps, cfg.sft_steps, cfg.eval_problems, cfg.run_dir) == (2, 0, 8, "/tmp/x")
    assert cfg.model.source == "preset:tiny-llama"
    gsm = config_from_args(build_parser().parse_args(["demo", "--task", "gsm8k"]))
    assert gsm.max_new_tokens == gsm.eval_max_new_tokens == 256
    assert config_from_args(build_parser().parse_args(["demo", "--advantage", "rloo"])).advantage == "rloo"


def test_demo_rejects_bad_values():
    with pytest.raises(ConfigError, match="steps"):
        DemoConfig(steps=0)
    with pytest.raises(ConfigError, match="task"):
        DemoConfig(task="mmlu")
    with pytest.raises(ConfigError, match="--advantage must be one of grpo"):
        DemoConfig(advantage="ppo")


def test_eval_command_parses():
    args = build_parser().parse_args(["eval", "--model", "smollm2-135m-instruct", "--task", "arithmetic",
                                      "--samples", "4", "--ks", "1,4"])
    assert args.task == "arithmetic" and args.samples == 4 and args.ks == "1,4"


@pytest.mark.slow
def test_short_demo_runs_end_to_end_on_a_tiny_model(tmp_path):
    """Base -> SFT -> GRPO on a random-init tiny model (2 SFT steps, 2 GRPO steps, 4 problems): the table has
    the three stages, and the run dir holds the reward curve, the GRPO metrics and results.json."""
    from tempax.algorithms.common import ModelSpec
    from tests.kit.tokenizers import tiny_chat_tokenizer

    tok_dir = tmp_path / "tokenizer"
    tiny_chat_tokenizer().hf.save_pretrained(str(tok_dir))
    spec = ModelSpec(source="preset:tiny-llama", tokenizer=str(tok_dir),
                     overrides={"vocab_size": 400, "max_position_embeddings": 1024})
    cfg = DemoConfig(model=spec, steps=2, sft_steps=2, eval_problems=4, eval_max_new_tokens=4, max_new_tokens=4,
                     group_size=2, sft_seq_len=512, sft_batch_size=2, train_problems=16, lora_rank=2,
                     run_dir=str(tmp_path / "demo"), progress_bar=False)
    lines: list[str] = []
    result = main(cfg, say=lines.append)
    assert [name for name, _ in result.evaluations] == ["base model", "after SFT", "after GRPO"]
    table = result.table.splitlines()
    assert len(table) == 5 and "after GRPO" in table[-1]
    for key in ("reward_curve", "metrics", "results"):
        assert os.path.getsize(result.files[key]) > 0, key
    with open(result.files["results"]) as f:
        saved = json.load(f)
    assert set(saved["stages"]) == {"base model", "after SFT", "after GRPO"}
    assert {"load", "sft", "grpo", "total"} <= set(saved["seconds"])
    assert any("Held-out" in line for line in lines)
