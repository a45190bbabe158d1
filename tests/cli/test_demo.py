"""`tempax demo` and `tempax eval`: argument parsing, and a shortened demo end to end on a tiny model."""

from __future__ import annotations

import json
import os

import pytest

from tempax.cli.demo import DEFAULT_MODEL, DemoConfig, config_from_args, main
from tempax.cli.main import build_parser
from tempax.errors import ConfigError


def test_demo_takes_no_arguments_and_maps_its_flags():
    """The flags are shortcuts for keys of the typed config (which embeds the SFT and GRPO configs); KEY=VALUE
    overrides reach any key of either."""
    args = build_parser().parse_args(["demo"])
    cfg = config_from_args(args)
    assert cfg == DemoConfig()
    assert cfg.model.source == DEFAULT_MODEL and cfg.task == "arithmetic"
    assert (cfg.sft.train.steps, cfg.grpo.train.steps, cfg.eval_problems) == (6, 10, 48)
    args = build_parser().parse_args(["demo", "--steps", "2", "--sft-steps", "0", "--eval-problems", "8",
                                      "--run-dir", "/tmp/x", "--model", "preset:tiny-llama",
                                      "grpo.guard.action=stop", "grpo.grpo.temperature=0.7"])
    cfg = config_from_args(args)
    assert (cfg.grpo.train.steps, cfg.sft, cfg.eval_problems, cfg.run_dir) == (2, None, 8, "/tmp/x")
    assert cfg.model.source == "preset:tiny-llama"
    assert cfg.grpo.guard.action == "stop" and cfg.grpo.grpo.temperature == 0.7
    assert config_from_args(build_parser().parse_args(["demo", "--sft-steps", "3"])).sft.train.steps == 3
    gsm = config_from_args(build_parser().parse_args(["demo", "--task", "gsm8k"]))
    assert gsm.grpo.grpo.max_new_tokens == gsm.grpo.eval.max_new_tokens == 256
    sft, grpo = cfg.stages("/tmp/x")
    assert sft is None and grpo.train.run_dir == "/tmp/x/grpo" and grpo.model.source == "preset:tiny-llama"
    rloo = config_from_args(build_parser().parse_args(["demo", "--advantage", "rloo"]))
    assert rloo.grpo.grpo.advantage == "rloo"


def test_demo_rejects_bad_values():
    from tempax.configlib import load_config

    with pytest.raises(ConfigError, match="steps"):
        load_config(DemoConfig, None, ["grpo.train.steps=0"])
    with pytest.raises(ConfigError, match="name"):
        load_config(DemoConfig, None, ["grpo.task.name=mmlu"])
    with pytest.raises(ConfigError, match="eval-problems"):
        load_config(DemoConfig, None, ["grpo.eval.num_problems=0"])
    with pytest.raises(ConfigError, match="advantage"):
        load_config(DemoConfig, None, ["grpo.grpo.advantage=ppo"])


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
    from tempax.configlib import from_dict

    lora = {"rank": 2, "alpha": 4.0}
    cfg = from_dict(DemoConfig, {
        "model": spec, "run_dir": str(tmp_path / "demo"), "progress_bar": False,
        "sft": {"lora": lora, "train": {"steps": 2, "batch_size": 2, "seq_len": 512}},
        "grpo": {"lora": lora, "task": {"num_train_problems": 16}, "grpo": {"group_size": 2, "max_new_tokens": 4},
                 "eval": {"num_problems": 4, "max_new_tokens": 4}, "train": {"steps": 2}},
    })
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
