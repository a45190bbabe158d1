"""The demo pipeline (`tempax demo`): its config's checks and stage configs, and a shortened demo end to end on a
tiny model."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from tempax.errors import ConfigError
from tempax.experiments.demo import DemoConfig, main


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
    with pytest.raises(ConfigError, match="--compare .*warm-start"):
        load_config(DemoConfig, None, ["compare=true", "sft=null"])
    with pytest.raises(ConfigError, match="budget must be one of .*'cpu'.*'gpu'"):
        load_config(DemoConfig, None, ["budget=gpu"])
    with pytest.raises(ConfigError, match="add --compare"):
        load_config(DemoConfig, None, ["rl_after_sft=true"])
    with pytest.raises(ConfigError, match="after_sft_overrides: .*grpo.betta"):
        load_config(DemoConfig, None, ["compare=true", "rl_after_sft=true", "after_sft_overrides=[grpo.betta=1]"])
    with pytest.raises(ConfigError, match="validation_every >= 1"):
        load_config(DemoConfig, None, ["compare=true", "validation_problems=10", "validation_every=0"])


def test_grpo_difficulty_changes_only_the_grpo_stage_training_problems():
    """The curriculum lever: grpo_difficulty sets the GRPO stage's training problems; the held-out problems,
    demonstrations and RFT keep the task's difficulty."""
    from tempax.experiments.demo import grpo_training
    from tempax.configlib import load_config
    from tempax.data.tasks.arithmetic import ArithmeticConfig

    cfg = load_config(DemoConfig, None, ["compare=true", "grpo_difficulty.max_steps=1",
                                         "grpo_difficulty.max_operand=20"])
    assert cfg.grpo_difficulty == ArithmeticConfig(max_steps=1, max_operand=20)
    _, grpo, _ = cfg.stages("/tmp/x")
    trained = grpo_training(grpo, cfg.grpo_difficulty)
    assert trained.task.arithmetic == cfg.grpo_difficulty and trained.task.seed == grpo.task.seed
    assert grpo.task.arithmetic == ArithmeticConfig() and cfg.compare_stages("/tmp/x")[1].task == grpo.task
    assert grpo_training(grpo, None) is grpo
    with pytest.raises(ConfigError, match="grpo_difficulty .*task gsm8k"):
        load_config(DemoConfig, None, ["grpo.task.name=gsm8k", "grpo_difficulty.max_steps=1"])


def test_held_out_problems_are_generated_in_calls_of_at_most_the_cap():
    """One call for the CPU demo's 48 problems; GSM8K's whole test set (1,319) in calls of 128 rows: in one call it
    needed 60.8 GB of device temporaries on a 16 GiB TPU chip."""
    from tempax.configlib import load_config

    _, grpo, _ = load_config(DemoConfig, None, []).stages("/tmp/x")
    assert grpo.eval.batch_size == grpo.eval.num_problems == 48
    _, grpo, _ = load_config(DemoConfig, None, ["grpo.eval.num_problems=1319"]).stages("/tmp/x")
    assert grpo.eval.batch_size == 128


def tiny_demo_config(tmp_path, *, grpo_steps: int, train_problems: int, compare: bool = False) -> DemoConfig:
    """The demo on a random-init tiny model: 2 SFT steps, `grpo_steps` GRPO steps of 2 samples x 4 tokens,
    4 held-out problems."""
    from tempax.algorithms.common import ModelSourceConfig
    from tempax.configlib import from_dict
    from tests.kit.tokenizers import tiny_chat_tokenizer

    tok_dir = tmp_path / "tokenizer"
    tiny_chat_tokenizer().hf.save_pretrained(str(tok_dir))
    spec = ModelSourceConfig(source="preset:tiny-llama", tokenizer=str(tok_dir),
                             overrides={"vocab_size": 400, "max_position_embeddings": 1024})
    lora = {"rank": 2, "alpha": 4.0}
    sft_train = {"batch_size": 2, "seq_len": 512}
    return from_dict(DemoConfig, {
        "model": spec, "run_dir": str(tmp_path / "demo"), "progress_bar": False, "compare": compare,
        "sft": {"lora": lora, "train": {"steps": 2, **sft_train}},
        "baseline": {"lora": lora, "train": sft_train}, "scarce_sft": {"lora": lora, "train": sft_train},
        "demonstrations": 8,
        # A random-init model passes no real checker: accept everything, so RFT has rounds to train on.
        "rft": {"lora": lora, "rft": {"group_size": 2, "problems_per_round": 2, "max_new_tokens": 4,
                                      "threshold": 0.0, "keep_truncated": True}, "train": sft_train},
        "grpo": {"lora": lora, "task": {"num_train_problems": train_problems},
                 "grpo": {"group_size": 2, "max_new_tokens": 4},
                 "eval": {"num_problems": 4, "max_new_tokens": 4}, "train": {"steps": grpo_steps}},
    })


@pytest.mark.slow
def test_short_demo_runs_end_to_end_on_a_tiny_model(tmp_path):
    """Base -> SFT -> GRPO on a random-init tiny model (2 SFT steps, 2 GRPO steps, 4 problems): the table has
    the three stages, and the run dir holds the reward curve, the GRPO metrics and results.json."""
    cfg = tiny_demo_config(tmp_path, grpo_steps=2, train_problems=16)
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


@pytest.mark.slow
def test_compare_demo_runs_the_scarce_demonstration_comparison(tmp_path):
    """--compare on a random-init tiny model: a warm-start on the 8 demonstrations, GRPO, then (a) SFT on the same
    8, (c) RFT and the reference SFT on fresh solutions, each until GRPO's process CPU seconds are spent
    (budget=cpu; the budget hook, not train.steps=1000, ends them), all evaluated on the same problems; the table has six stages with Wilson
    intervals and the paired (b) - (a), (c) - (a) lines."""
    from tempax.experiments.demo import COMPARE_GRPO_STAGE, REFERENCE_STAGE, RFT_STAGE, SCARCE_STAGE

    cfg = dataclasses.replace(tiny_demo_config(tmp_path, grpo_steps=3, train_problems=64, compare=True),
                              budget="cpu")
    result = main(cfg, say=lambda text: None)
    assert [name for name, _ in result.evaluations] == ["base model", "after SFT", COMPARE_GRPO_STAGE, SCARCE_STAGE,
                                                        RFT_STAGE, REFERENCE_STAGE]
    budget = result.budget
    for name in (SCARCE_STAGE, RFT_STAGE, REFERENCE_STAGE):
        stage = budget["stages"][name]
        assert 1 <= stage["steps"] < 1000, name
        # budget=cpu: it stops at the first step whose midpoint passes GRPO's process CPU seconds, so within one
        # step (an RFT step may carry a round's sampling) of them.
        step_cpu = stage["cpu_seconds"] / stage["steps"]
        assert budget["clock"] == "cpu" and budget["budget_seconds"] == budget["grpo_cpu_seconds"]
        assert abs(stage["cpu_seconds"] - budget["grpo_cpu_seconds"]) <= step_cpu + 5.0, name
    with open(os.path.join(cfg.run_dir, "sft_examples.jsonl")) as f:
        assert sum(1 for _ in f) == 8  # the warm-start saw only the N demonstrations
    with open(os.path.join(cfg.run_dir, "scarce_examples.jsonl")) as f:
        assert sum(1 for _ in f) == 8  # and (a) the same N
    lines = result.table.splitlines()
    assert RFT_STAGE in lines[6] and "[" in lines[6]
    assert lines[8].startswith(f"{COMPARE_GRPO_STAGE} minus {SCARCE_STAGE}, answers") and "95% CI" in lines[8]
    assert any(line.startswith(f"{RFT_STAGE} minus {SCARCE_STAGE}, answers") for line in lines)
    with open(result.files["results"]) as f:
        saved = json.load(f)
    with open(os.path.join(cfg.run_dir, "outcomes.jsonl")) as f:
        written = [json.loads(line) for line in f]
    assert [w["stage"] for w in written] == [name for name, _ in result.evaluations]
    assert all(len(w["correct"]) == 4 for w in written)
    paired = saved["comparison"][f"{RFT_STAGE} minus {SCARCE_STAGE}"]["answers"]
    assert paired["both"] + paired["only_a"] + paired["only_b"] + paired["neither"] == 4
    assert paired["low"] <= paired["difference"] <= paired["high"]


@pytest.mark.slow
def test_compare_keeps_a_at_its_best_validation_score_and_runs_grpo_after_it(tmp_path):
    """validation_problems and rl_after_sft on a random-init tiny model: (a) is scored on the last 4 training
    problems after every step and stops after one score without improvement (or at GRPO's budget), keeping its best
    weights; (d) GRPO, at its own learning rate (after_sft_overrides), starts from them and trains until GRPO's CPU
    seconds are spent; the table adds (d) - (a) and (d) - (b). rft=null skips (c)."""
    from tempax.experiments.demo import AFTER_SFT_STAGE, COMPARE_GRPO_STAGE, SCARCE_STAGE

    cfg = dataclasses.replace(tiny_demo_config(tmp_path, grpo_steps=3, train_problems=64, compare=True),
                              budget="cpu", reference=False, validation_problems=4, validation_every=1,
                              validation_patience=1, rl_after_sft=True, rft=None,
                              after_sft_overrides=("train.optimizer.learning_rate=3e-5",))
    lines: list[str] = []
    result = main(cfg, say=lines.append)
    assert [name for name, _ in result.evaluations] == ["base model", "after SFT", COMPARE_GRPO_STAGE, SCARCE_STAGE,
                                                        AFTER_SFT_STAGE]
    validation = result.budget["validation"]
    steps = result.budget["stages"][SCARCE_STAGE]["steps"]
    assert validation["problems"] == 4 and [s for s, _ in validation["scores"]] == list(range(1, steps + 1))
    scores = [v for _, v in validation["scores"]]
    assert validation["kept_score"] == max(scores) and validation["scores"][scores.index(max(scores))][0] == \
        validation["kept_step"]
    after = result.budget["stages"][AFTER_SFT_STAGE]
    assert 1 <= after["steps"] < 1000
    with open(os.path.join(cfg.run_dir, "grpo_after_sft", "metrics.jsonl")) as f:
        rates = {json.loads(line).get("lr") for line in f} - {None}
    assert len(rates) == 1 and rates.pop() == pytest.approx(3e-5)
    table = result.table.splitlines()
    assert any(line.startswith(f"{AFTER_SFT_STAGE} minus {SCARCE_STAGE}, answers") for line in table)
    assert any(line.startswith(f"{AFTER_SFT_STAGE} minus {COMPARE_GRPO_STAGE}, answers") for line in table)
    assert any(line.startswith(f"(a) kept the weights of step {validation['kept_step']}") for line in lines)


def test_compare_needs_a_task_with_sft_targets(tmp_path):
    """Task rows without ideal completions (a jsonl task of questions and answers only) leave nothing to continue
    SFT on: a clear error before the model is loaded (the model source below does not exist). GSM8K's rows carry
    their worked solutions as targets, so --compare goes on to load the model there."""
    from tempax.configlib import load_config

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "1 + 1?", "answer": "2"}) + "\n")
    cfg = load_config(DemoConfig, None, ["compare=true", "grpo.task.name=jsonl", f"grpo.task.source={rows}",
                                         "grpo.eval.num_problems=1", "demonstrations=1", "validation_problems=0",
                                         f"run_dir={tmp_path / 'run'}", "model.source=/nonexistent/model"])
    with pytest.raises(ConfigError, match="--compare trains SFT on the task's ideal completions; task"):
        main(cfg, say=lambda text: None)

    data = tmp_path / "gsm8k"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}) + "\n")
    cfg = load_config(DemoConfig, None, ["compare=true", "grpo.task.name=gsm8k", f"grpo.task.source={data}",
                                         "grpo.eval.num_problems=1", "demonstrations=1", "validation_problems=0",
                                         f"run_dir={tmp_path / 'run2'}", "model.source=/nonexistent/model"])
    with pytest.raises(Exception, match="/nonexistent/model") as failed:
        main(cfg, say=lambda text: None)
    assert "ideal completions" not in str(failed.value)
