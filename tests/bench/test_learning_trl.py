"""bench/learning_trl.py: its table from hand-made outcomes; TRL's side of the KTO, SFT, reward-model and GRPO rows on a
tiny model (tempax's tokens, order and initial weights in, TRL's first loss equal to tempax's, the trained adapter
read back by tempax); and (slow) the --tiny smoke run of every built row through both libraries."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys

import pytest

from bench.learning_trl import (ROWS, _overrides, load_row_config, main, prepare_row, row_slug, selected, table,
                                table_record, write_base)
from bench.trl_sides.common import HEAD_FILE, INITIAL_ADAPTERS, train_trl, write_inputs
from bench.trl_sides.grpo import answer_outcomes
from bench.trl_sides.preference import pair_outcomes
from tests.algorithms.preference.test_dpo import WORDS, synthetic_rows, write_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def row(name):
    return next(r for r in ROWS if r.name == name)


def sft_dialogues(n: int, seed: int) -> list[dict]:
    """Chat rows for SFT: a question and an answer, every other one a second turn (assistant tokens in two
    places), short enough that a 64-token row packs two or three of them."""
    rng = random.Random(seed)
    rows = []
    for k in range(n):
        a, b = rng.sample(WORDS, 2)
        messages = [{"role": "user", "content": f"Tell me about {a}."}, {"role": "assistant", "content": f"{a} {b}."}]
        if k % 2:
            messages += [{"role": "user", "content": "More?"}, {"role": "assistant", "content": f"{b}."}]
        rows.append({"messages": messages})
    return rows


def test_rows_not_built_or_not_run_print_not_run_and_paired_differences_are_judged(tmp_path):
    """KTO on 10 held-out pairs: tempax right on pairs 0-6 (7/10), TRL on pairs 0-3 and 7 (5/10): the paired
    difference 0.7 - 0.5 = +20.0 points; 3 pairs only tempax gets, 1 only TRL, so Newcombe's paired interval
    (tempax.eval.metrics) spans 0 ('inside'). SFT on 4 held-out examples, per-example losses tempax [2.0, 1.5, 3.0,
    2.5] (mean 2.25), TRL [1.8, 1.6, 2.7, 2.1] (mean 2.05), before [2.5, 2.0, 3.5, 3.0] (mean 2.75): tempax - TRL
    = +0.2 with the paired t interval [-0.1437, +0.5437] (worked out in tests/eval/test_metrics.py). Budgets come
    from the budget files; DPO and the reward model have no files: not run; GRPO has no TRL side."""
    kto = tmp_path / row_slug(row("KTO"))
    kto.mkdir()
    (kto / "outcomes.json").write_text(json.dumps({
        "before": [False] * 10, "tempax": [True] * 7 + [False] * 3,
        "trl": [True] * 4 + [False] * 3 + [True] + [False] * 2,
        "train_loss": {"tempax": [0.5, 0.49], "trl": [0.5, 0.4899]}}))
    (kto / "tempax.budget.json").write_text(json.dumps({"wall_s": 30.2, "cpu_s": 41.0, "exit": 0}))
    (kto / "trl.budget.json").write_text(json.dumps({"wall_s": 70.6, "cpu_s": 90.4, "exit": 0}))
    sft = tmp_path / row_slug(row("SFT"))
    sft.mkdir()
    (sft / "outcomes.json").write_text(json.dumps({
        "before": [2.5, 2.0, 3.5, 3.0], "tempax": [2.0, 1.5, 3.0, 2.5], "trl": [1.8, 1.6, 2.7, 2.1],
        "train_loss": {"tempax": [2.9, 2.6], "trl": [2.9, 2.61]}}))
    (sft / "tempax.budget.json").write_text(json.dumps({"wall_s": 10.0, "cpu_s": 12.0, "exit": 0}))
    (sft / "trl.budget.json").write_text(json.dumps({"wall_s": 20.0, "cpu_s": 25.0, "exit": 1}))
    lines = table(ROWS, str(tmp_path), "Some CPU, 2 cores").splitlines()
    assert "Some CPU, 2 cores" in lines[0] and "trl " in lines[0] and "torch " in lines[0]
    by_name = {line.split(" | ")[0][2:]: line for line in lines[4:]}
    assert set(by_name) == {r.name for r in ROWS}
    line = by_name["KTO"]
    assert "preference accuracy, tempax: a tie -> 70.0% [" in line and "TRL: a tie -> 50.0% [" in line
    assert "+20.0 [" in line and "(inside its interval), paired" in line
    assert "| 30 / 41 | 71 / 90 | 0.500000 .. 0.4900 / 0.500000 .. 0.4899 |" in line
    line = by_name["SFT"]
    assert "held-out loss (nats), tempax: 2.7500 of 4 -> 2.2500 of 4 | TRL: 2.7500 of 4 -> 2.0500 of 4 |" in line
    assert "| +0.2000 [-0.1437, +0.5437] nats (inside its interval), paired t |" in line
    assert "| 10 / 12 | 20 / 25 |" in line
    assert "| not run |" in by_name["DPO"] and "| not run |" in by_name["reward model"]
    assert "| not run |" in by_name["GRPO, arithmetic"]
    # GRPO's last column is the mean sampled reward of the first and last step (its loss is 0 at every step).
    grpo = tmp_path / row_slug(row("GRPO, arithmetic"))
    grpo.mkdir()
    (grpo / "outcomes.json").write_text(json.dumps({
        "before": [False] * 4, "tempax": [True, True, False, False], "trl": [True, False, False, False],
        "train_reward": {"tempax": [0.35, 0.9, 1.51], "trl": [0.514, 1.246]}}))
    line = table(ROWS, str(tmp_path), "Some CPU, 2 cores").splitlines()[-1]
    assert line.startswith("| GRPO, arithmetic | answer accuracy, tempax: 0.0% [") and "-> 50.0% [" in line
    assert line.endswith("| - | - | reward: 0.35 .. 1.51 / 0.51 .. 1.25 |"), line
    assert [r.name for r in selected(None)] == ["SFT", "DPO", "KTO", "reward model", "GRPO, arithmetic"]
    assert [r.name for r in selected("kto,reward-model")] == ["KTO", "reward model"]
    record = table_record(ROWS, str(tmp_path), "Some CPU, 2 cores", "python bench/learning_trl.py --peer trl")
    assert record["columns"][0] == "row" and len(record["columns"]) == 7
    assert [r[0] for r in record["rows"]] == ["SFT", "KTO", "GRPO, arithmetic"] and record["rows"][1][4:6] == ["30 / 41", "71 / 90"]
    assert record["cpu"] == "Some CPU, 2 cores" and record["topic"] == "learning"


def test_a_table_of_several_runs_adds_the_rows_that_ran_in_the_later_folders(tmp_path):
    """`--table A,B`: A's table as always, then B's GRPO run (its only row with outcomes) labelled with B's name;
    the record keeps both GRPO rows."""
    for folder, tempax_right in (("first", 2), ("seed1", 3)):
        grpo = tmp_path / folder / row_slug(row("GRPO, arithmetic"))
        grpo.mkdir(parents=True)
        (grpo / "outcomes.json").write_text(json.dumps({
            "before": [False] * 4, "tempax": [True] * tempax_right + [False] * (4 - tempax_right),
            "trl": [True, False, False, False], "train_reward": {"tempax": [0.5, 1.0], "trl": [0.5, 0.9]}}))
    first, later = str(tmp_path / "first"), str(tmp_path / "seed1")
    lines = table(ROWS, first, "Some CPU", (later,)).splitlines()
    assert len(lines) == 4 + len(ROWS) + 1
    assert lines[-2].startswith("| GRPO, arithmetic | answer accuracy, tempax: 0.0% [") and "-> 50.0% [" in lines[-2]
    assert lines[-1].startswith("| GRPO, arithmetic (seed1) | answer accuracy, tempax: 0.0% [") and "-> 75.0% [" in lines[-1]
    record = table_record(ROWS, first, "Some CPU", "the commands", (later,))
    assert [r[0] for r in record["rows"]] == ["GRPO, arithmetic", "GRPO, arithmetic (seed1)"]
    assert record["command"] == "the commands" and record["notes"].startswith("tempax ")  # the versions alone
    noted = table_record(ROWS, first, "Some CPU", "the commands", (later,), notes="Both sides end level.")
    assert noted["notes"].startswith("Both sides end level. tempax ")


def test_the_grpo_row_is_the_demos_grpo_stage():
    """The GRPO row's overrides turn the GSM8K recipe into `tempax demo`'s GRPO stage: the same algorithm settings,
    adapters, rewards, task, optimiser and loop (10 steps of 2 prompts, the whole batch in one pass), scored on
    200 held-out problems with the demo's 48-token budget."""
    from tempax.experiments.demo import demo_grpo_config

    grpo = row("GRPO, arithmetic")
    cfg = load_row_config(grpo, _overrides(grpo, "BASE", False, ()))
    demo = demo_grpo_config()
    assert cfg.grpo == demo.grpo and cfg.lora == demo.lora and cfg.rewards == demo.rewards and cfg.task == demo.task
    assert cfg.train.optimizer == demo.train.optimizer
    loop = lambda t: (t.steps, t.batch_size, t.micro_batch_size, t.remat, t.precision, t.seed)
    assert loop(cfg.train) == loop(demo.train)
    assert cfg.eval.max_new_tokens == demo.eval.max_new_tokens and cfg.eval.num_problems == 200


def test_overrides_scoped_to_commands_reach_those_rows_only():
    """`sft:data.path=D` reaches the SFT row only, `dpo,kto:data.path=P` the DPO and KTO rows; a value holding a
    colon (`train.run_dir=a:b`) is not a scope."""
    extra = ("sft:data.path=D", "dpo,kto:data.path=P", "train.run_dir=a:b")
    assert _overrides(row("SFT"), "BASE", False, extra)[-2:] == ["data.path=D", "train.run_dir=a:b"]
    assert _overrides(row("KTO"), "BASE", False, extra)[-2:] == ["data.path=P", "train.run_dir=a:b"]
    assert _overrides(row("reward model"), "BASE", False, extra)[-1:] == ["train.run_dir=a:b"]


def test_the_trl_child_imports_no_jax():
    """The TRL side's process time is TRL's own: importing the bench (as its `--side trl` child does) loads neither
    JAX nor tempax's CLI."""
    code = ("import sys; sys.path.insert(0, '.'); import bench.learning_trl; "
            "assert 'jax' not in sys.modules and 'tempax.cli.demo' not in sys.modules, 'JAX imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("learning_trl")
    return {"base": write_base(str(d / "base"), tiny=True),
            "train": write_jsonl(str(d / "pairs.jsonl"), synthetic_rows(8, seed=0)),
            "test": write_jsonl(str(d / "test.jsonl"), synthetic_rows(6, seed=1)),
            "dialogues": write_jsonl(str(d / "dialogues.jsonl"), sft_dialogues(20, seed=2)), "dir": d}


def _trl_history(out: str) -> list[dict]:
    return [r for r in json.loads(open(os.path.join(out, "log_history.json")).read()) if "loss" in r]


@pytest.mark.heavy
@pytest.mark.needs_torch
def test_trl_kto_side_trains_on_tempaxs_rows_from_tempaxs_adapters_and_reads_back(tiny_files):
    """TRL gets 2 steps x 2 examples in tempax's order; each KL completion is the completion of that row's
    mismatched partner (another prompt's reply); with B = 0 the policy is the reference at the first step, so
    every log-ratio is 0 and TRL's first loss is 1 - sigmoid(0) = 0.5 exactly; its adapter loads into tempax
    (PEFT layout) and scores the 6 held-out pairs. With 1 warm-up step of 2, tempax's rate is the peak for both
    updates (warm-up (0 + 1) / 1, then the cosine at progress 0): TRL's updates use the same, where transformers'
    own warm-up would have given the first a rate of 0. TRL trains in float32 as tempax's fp32 run does (TRL's
    configs default to bf16 autocast)."""
    overrides = [f"model.source={tiny_files['base']}", *row("KTO").tiny, f"data.path={tiny_files['train']}",
                 f"data.eval_path={tiny_files['test']}", "train.optimizer.warmup_steps=1"]
    kto = row("KTO")
    cfg = load_row_config(kto, overrides)
    out = str(tiny_files["dir"] / "trl_kto")
    write_inputs(kto.trl, cfg, tiny_files["base"], out)
    inputs = json.loads(open(os.path.join(out, "trl_inputs.json")).read())
    assert len(inputs["rows"]) == 4 and inputs["arguments"]["per_device_train_batch_size"] == 2
    assert inputs["arguments"]["bf16"] is False
    assert all(r["KL_completion_ids"] != r["completion_ids"] for r in inputs["rows"])
    train_trl(kto.trl, tiny_files["base"], out)
    history = _trl_history(out)
    losses = [r["loss"] for r in history]
    assert len(losses) == 2 and losses[0] == pytest.approx(0.5, abs=1e-7)
    peak = cfg.train.optimizer.learning_rate
    assert inputs["lr_factors"] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert [r["learning_rate"] for r in history] == [pytest.approx(peak), pytest.approx(peak)]
    outcomes = pair_outcomes(cfg, tiny_files["base"], os.path.join(out, "adapters"))
    assert len(outcomes) == 6 and all(isinstance(x, bool) for x in outcomes)


@pytest.mark.heavy
@pytest.mark.needs_torch
def test_trl_grpo_side_samples_tempaxs_prompts_in_order_and_scores_them_with_the_demos_rewards(tiny_files):
    """TRL's GRPOTrainer gets the 2 prompts tempax's sampler draws over 2 steps of 1 prompt, in that order, as
    tempax's token ids (its own tokenisation of the text is bypassed: the spy sees those ids, once per step), and
    the demo's two reward functions take TRL's call as they are (TRL logs a mean for each); its adapter loads into
    tempax and answers the 6 held-out problems."""
    from tempax.data.tasks.spec import load_task
    from tempax.models.registry import load_tokenizer
    from tempax.rl.rollout import PromptSampler, encode_prompts

    grpo = row("GRPO, arithmetic")
    overrides = [f"model.source={tiny_files['base']}", *grpo.overrides, *grpo.tiny]
    cfg = load_row_config(grpo, overrides)
    out = str(tiny_files["dir"] / "trl_grpo")
    write_inputs(grpo.trl, cfg, tiny_files["base"], out)
    inputs = json.loads(open(os.path.join(out, "trl_inputs.json")).read())
    train_rows, _ = load_task(cfg.task, eval_problems=cfg.eval.num_problems)
    prompts, _ = encode_prompts(load_tokenizer(tiny_files["base"]), train_rows, max_prompt_len=512)
    sampler = PromptSampler(prompts, seed=cfg.train.seed)
    drawn = [sampler.next(1)[0] for _ in range(2)]
    assert [r["prompt_ids"] for r in inputs["rows"]] == [list(p.ids) for p in drawn]
    assert [r["answer"] for r in inputs["rows"]] == [p.columns["answer"] for p in drawn]
    args = inputs["arguments"]
    assert (args["per_device_train_batch_size"], args["num_generations"], args["max_completion_length"]) == (2, 2, 8)
    assert (args["loss_type"], args["beta"], args["shuffle_dataset"], args["bf16"]) == ("grpo", 0.0, False, False)

    seen: list[list[int]] = []

    def spy(trainer_cls, prepared):
        cls, extra = grpo.trl.specialise(trainer_cls, prepared)

        class Spied(cls):
            def _tokenize_prompts(self, texts):
                ids, images, fields = super()._tokenize_prompts(texts)
                seen.extend(ids)
                return ids, images, fields

        return Spied, extra

    train_trl(dataclasses.replace(grpo.trl, specialise=spy), tiny_files["base"], out)
    assert seen == [r["prompt_ids"] for r in inputs["rows"] for _ in range(2)]  # each prompt x 2 completions
    history = _trl_history(out)
    assert len(history) == 2
    assert all("rewards/format_reward/mean" in r and "rewards/answer_correctness_reward/mean" in r for r in history)
    outcomes = answer_outcomes(cfg, tiny_files["base"], os.path.join(out, "adapters"))
    assert len(outcomes) == 6 and all(isinstance(x, bool) for x in outcomes)


@pytest.mark.heavy
@pytest.mark.needs_torch
def test_trl_sft_side_trains_on_tempaxs_packed_rows_and_its_first_loss_is_tempaxs(tiny_files):
    """The SFT row splits the 20 dialogues once (6 held out), and TRL gets tempax's first 2 batches of 2 packed
    64-token rows (at least one row holds several examples, so the loss depends on attention staying inside each
    example). TRL's first logged loss is the loss of the first batch under the starting weights (LoRA B = 0: the
    base model); tempax's loss function (`make_sft_loss`, the fused head of the recipe) on tempax's first batch
    gives the same to 1e-5, which holds only if TRL's packed-sequence masking keeps the examples apart, its
    labels are tempax's targets and its loss is the same token mean. The adapter reads back into tempax and scores
    the 6 held-out examples."""
    import numpy as np

    from bench.trl_sides.sft import evaluate_held_out_loss
    from tempax.algorithms.common import build_model
    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.data.sft import build_data

    sft = row("SFT")
    row_dir = str(tiny_files["dir"] / "SFT")
    os.makedirs(row_dir)
    overrides = prepare_row(sft, [f"model.source={tiny_files['base']}", *sft.tiny,
                                  f"data.path={tiny_files['dialogues']}"], row_dir)
    cfg = load_row_config(sft, overrides)
    out = os.path.join(row_dir, "trl")
    inputs = json.loads(open(os.path.join(out, "trl_inputs.json")).read())
    rows = inputs["rows"]
    assert len(rows) == 4 and inputs["arguments"]["padding_free"] is True
    assert max(len(r["seq_lengths"]) for r in rows) >= 2  # packed: examples share a row
    model, tokenizer, _ = build_model(cfg)
    t = cfg.train
    first = next(build_data(cfg.data, tokenizer, batch_size=t.batch_size, seq_len=t.seq_len, seed=t.seed).train)
    assert rows[0]["input_ids"] == first["tokens"][0, : len(rows[0]["input_ids"])].tolist()
    loss_fn = make_sft_loss(cfg.loss.normalize, fused=cfg.loss.fused, chunk_len=cfg.loss.chunk_len)
    tempax_first = float(loss_fn(model, {k: np.asarray(v) for k, v in first.items()})[0])
    train_trl(sft.trl, tiny_files["base"], out)
    losses = [r["loss"] for r in _trl_history(out)]
    assert len(losses) == 2 and losses[0] == pytest.approx(tempax_first, abs=1e-5), (losses, tempax_first)
    outcomes = evaluate_held_out_loss(cfg, tiny_files["base"], row_dir)
    assert len(outcomes["before"]) == len(outcomes["trl"]) == 6 and "tempax" not in outcomes
    assert outcomes["trl"] != outcomes["before"]  # the trained adapter was read back, not the base


@pytest.mark.needs_torch
def test_trl_reward_side_starts_from_tempaxs_head_and_its_first_loss_is_tempaxs(tiny_files):
    """TRL's sequence classifier gets tempax's initial adapters and its initial head (drawn from seed
    train.seed + 2) as `score`; its first logged loss, -log sigmoid(r_c - r_r) averaged over the first batch's 2
    pairs under the starting weights, equals tempax's `RewardLoss` of the same batch to 1e-5 (the same pooling at
    the last token, the same head, the same pairs in the same order). The head trains on both sides: TRL's saved
    head differs from the initial one, and tempax reads adapters + head back as a `RewardModel` and scores the 6
    held-out pairs."""
    import numpy as np
    from safetensors.numpy import load_file

    from bench.trl_sides.reward_model import evaluate_reward_accuracy
    from tempax.algorithms.preference.batches import annotated_pair_loader
    from tempax.algorithms.preference.data import build_preference_data
    from tempax.algorithms.preference.reward import RewardLoss, build_reward_model
    from tempax.models import reward_model

    assert HEAD_FILE == reward_model.HEAD_FILE
    rm = row("reward model")
    row_dir = str(tiny_files["dir"] / "reward_model")
    os.makedirs(row_dir)
    overrides = prepare_row(rm, [f"model.source={tiny_files['base']}", *rm.tiny, f"data.path={tiny_files['train']}",
                                 f"data.eval_path={tiny_files['test']}"], row_dir)
    cfg = load_row_config(rm, overrides)
    out = os.path.join(row_dir, "trl")
    model, tokenizer, _ = build_reward_model(cfg)
    initial = load_file(os.path.join(out, INITIAL_ADAPTERS, HEAD_FILE))["score.weight"]
    assert np.array_equal(initial, np.asarray(model.score.kernel[...]).T)
    pairs = build_preference_data(cfg.data, tokenizer, seq_len=cfg.train.seq_len, seed=cfg.train.seed).train
    first = next(annotated_pair_loader(pairs, batch_size=2, seq_len=cfg.train.seq_len, pad_id=tokenizer.pad_id,
                                       seed=cfg.train.seed, shuffle=cfg.data.shuffle))
    tempax_first = float(RewardLoss()(model, {k: np.asarray(v) for k, v in first.items()})[0])
    train_trl(rm.trl, tiny_files["base"], out)
    losses = [r["loss"] for r in _trl_history(out)]
    assert len(losses) == 2 and losses[0] == pytest.approx(tempax_first, abs=1e-5), (losses, tempax_first)
    trained = load_file(os.path.join(out, "adapters", HEAD_FILE))["score.weight"]
    assert trained.shape == initial.shape and not np.array_equal(trained, initial)
    outcomes = evaluate_reward_accuracy(cfg, tiny_files["base"], row_dir)
    assert len(outcomes["before"]) == len(outcomes["trl"]) == 6 and "tempax" not in outcomes


@pytest.mark.slow
@pytest.mark.needs_torch
def test_tiny_smoke_run_trains_both_sides_alike_and_scores_both_with_tempax(tmp_path, capsys, monkeypatch):
    """Both libraries train 2 steps of every built row on the same tiny base, rows, order and initial weights;
    tempax scores both final models on the same held-out items (6 pairs; 6 dialogues for SFT; 6 problems for GRPO). The same run on
    both sides: the first losses agree to 1e-5 (KTO 0.5 and DPO log 2 = 0.693147 exactly, since the policy starts
    as the reference; SFT and the reward model whatever the starting weights give) and the second to 1e-4."""
    # The children train on this machine's devices, not the eight virtual ones of the test process (conftest):
    # a 4-row batch cannot be split across 8 data-parallel devices.
    monkeypatch.setenv("XLA_FLAGS", "")
    train = write_jsonl(str(tmp_path / "pairs.jsonl"), synthetic_rows(8, seed=0))
    test = write_jsonl(str(tmp_path / "test.jsonl"), synthetic_rows(6, seed=1))
    dialogues = write_jsonl(str(tmp_path / "dialogues.jsonl"), sft_dialogues(20, seed=2))
    out = tmp_path / "out"
    pairs = "dpo,kto,reward-model"
    assert main(["--tiny", "--out", str(out), "--", f"sft:data.path={dialogues}", f"{pairs}:data.path={train}",
                 f"{pairs}:data.eval_path={test}"]) == 0
    printed = capsys.readouterr().out
    for name, first in (("SFT", None), ("DPO", 0.693147), ("KTO", 0.5), ("reward_model", None)):
        folder = out / name
        logs = {p: (folder / p).read_text()[-3000:] for p in os.listdir(folder) if p.endswith(".log")}
        outcomes = json.loads((folder / "outcomes.json").read_text())
        assert "tempax" in outcomes and "trl" in outcomes, logs
        assert len(outcomes["tempax"]) == len(outcomes["trl"]) == len(outcomes["before"]) == 6
        ours, theirs = outcomes["train_loss"]["tempax"], outcomes["train_loss"]["trl"]
        assert abs(ours[0] - theirs[0]) < 1e-5 and abs(ours[1] - theirs[1]) < 1e-4, (name, ours, theirs)
        if first is not None:
            assert ours[0] == pytest.approx(first, abs=1e-5)
        line = next(x for x in printed.splitlines() if x.startswith(f"| {name.replace('_', ' ')} |"))
        assert "paired" in line and "not run" not in line and "failed" not in line, line
    # GRPO samples on each side (its first loss is 0 on both: beta 0, one pass): both trained from the warm-start
    # the preparation wrote, and tempax scored both on the 6 held-out problems.
    outcomes = json.loads((out / "GRPO" / "outcomes.json").read_text())
    assert len(outcomes["tempax"]) == len(outcomes["trl"]) == len(outcomes["before"]) == 6
    assert (out / "GRPO" / "start" / "config.json").is_file()
    line = next(x for x in printed.splitlines() if x.startswith("| GRPO, arithmetic |"))
    assert "paired" in line and "not run" not in line and "failed" not in line, line


def test_losses_equal_to_float_rounding_name_no_winner():
    """Per-example gaps of a few 1e-6 nats (float32 summation order) can give a paired t interval that excludes 0;
    below SAME_LOSS_NATS the cell says the losses are the same, with the largest gap."""
    from bench.learning_trl import _loss_difference

    ours = [2.0 + 1e-6, 1.5 + 2e-6, 3.0 + 1.5e-6, 2.5 + 1e-6]
    theirs = [2.0, 1.5, 3.0, 2.5]
    cell = _loss_difference(ours, theirs)
    assert "the same to float rounding: no example differs by more than 2.0e-06" in cell
    assert "TRL lower" in _loss_difference([x + 0.01 for x in theirs], [x - 0.001 * i for i, x in enumerate(theirs)])
