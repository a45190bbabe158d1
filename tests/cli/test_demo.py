"""`tempax demo` and `tempax eval`: the flags map to the demo's config keys (the pipelines themselves:
tests/experiments/test_demo.py and test_tool_demo.py)."""

from __future__ import annotations

from tempax.cli.demo import config_from_args
from tempax.cli.main import build_parser
from tempax.experiments.demo import DEFAULT_MODEL, DemoConfig


def test_demo_takes_no_arguments_and_maps_its_flags():
    """The flags are shortcuts for keys of the typed config (which embeds the SFT and GRPO configs); KEY=VALUE
    overrides reach any key of either."""
    from tempax.configlib import load_config

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
    assert gsm.grpo.task.source is None  # the Hub's openai/gsm8k; --source names a local copy
    local = config_from_args(build_parser().parse_args(["demo", "--task", "gsm8k", "--source", "data/gsm8k"]))
    assert local.grpo.task.source == "data/gsm8k" and local.task == "gsm8k"
    sft, grpo, baseline = cfg.stages("/tmp/x")
    assert sft is None and grpo.train.run_dir == "/tmp/x/grpo" and grpo.model.source == "preset:tiny-llama"
    assert baseline is None and DemoConfig().compare is False
    compare = config_from_args(build_parser().parse_args(["demo", "--compare", "--eval-problems", "200"]))
    assert compare.compare is True and compare == load_config(DemoConfig, None, ["compare=true",
                                                                                "grpo.eval.num_problems=200"])
    _, _, baseline = compare.stages("/tmp/x")
    assert baseline.train.run_dir == "/tmp/x/baseline_sft" and baseline.data.path == "/tmp/x/baseline_examples.jsonl"
    assert baseline.lora == compare.sft.lora and baseline.train.seed == compare.seed
    scarce, rft = compare.compare_stages("/tmp/x")
    assert scarce.data.path == "/tmp/x/scarce_examples.jsonl" and rft.train.run_dir == "/tmp/x/rft"
    assert rft.task == compare.grpo.task and rft.rewards == compare.grpo.rewards and rft.eval.num_problems == 0
    n = config_from_args(build_parser().parse_args(["demo", "--compare", "--demonstrations", "96"]))
    assert n.demonstrations == 96 and DemoConfig().demonstrations == 64
    rloo = config_from_args(build_parser().parse_args(["demo", "--advantage", "rloo"]))
    assert rloo.grpo.grpo.advantage == "rloo"


def test_budget_flag_maps_to_the_config():
    from tempax.configlib import load_config

    assert DemoConfig().budget == "wall"
    args = build_parser().parse_args(["demo", "--compare", "--budget", "cpu"])
    assert config_from_args(args).budget == "cpu"
    assert DemoConfig().reference is True
    assert load_config(DemoConfig, None, ["compare=true", "reference=false"]).reference is False


def test_on_an_accelerator_the_demo_scores_more_problems_and_trains_longer_unless_told_otherwise():
    from tempax.cli.demo import ACCELERATOR_SIZES, demo_sizes
    from tempax.configlib import load_config

    assert demo_sizes("auto", "cpu") == () and demo_sizes("cpu", "tpu") == ()
    assert demo_sizes("auto", "tpu") == demo_sizes("auto", "gpu") == ACCELERATOR_SIZES
    assert demo_sizes("accelerator", "cpu") == ACCELERATOR_SIZES
    big = config_from_args(build_parser().parse_args(["demo", "--size", "accelerator"]))
    assert (big.sft.train.steps, big.grpo.train.steps, big.eval_problems) == (30, 60, 300)
    # --compare's arms end when GRPO's time is spent, not at the CPU's step bound
    assert big.scarce_sft.train.steps == big.baseline.train.steps == big.rft.train.steps == 100000
    assert load_config(DemoConfig, None, [*ACCELERATOR_SIZES, "rft=null"]).rft is None
    # flags and KEY=VALUE overrides come after the sizes, so they win
    mine = config_from_args(build_parser().parse_args(["demo", "--size", "accelerator", "--steps", "5",
                                                       "--sft-steps", "0", "grpo.eval.num_problems=20"]))
    assert (mine.sft, mine.grpo.train.steps, mine.eval_problems) == (None, 5, 20)
    assert config_from_args(build_parser().parse_args(["demo"])).eval_problems == 48  # this CPU: auto is cpu
