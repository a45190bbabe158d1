"""The loop around the step: resume == uninterrupted, checkpoint layout and retention, metrics files, hooks."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax.algorithms.sft.main import make_sft_loss
from tempax.data.loader import sft_loader
from tempax.train.config import CheckpointConfig, OptimizerConfig
from tempax.train.hooks import Hook, every
from tempax.train.loop import Trainer
from tempax.train.metrics import read_metrics
from tests.train.helpers import TableLM, host, random_examples, tiny_train_config

VOCAB = 16


def _loader():
    # Shuffled, packed batches over 40 examples: 6 steps cross an epoch boundary, so the restored data position
    # (epoch, batch) matters as much as the restored parameters and optimizer moments.
    return sft_loader(random_examples(40, vocab=VOCAB, seed=3), batch_size=4, seq_len=16, pad_id=0, seed=7)


def _trainer(run_dir, steps, **ckpt):
    cfg = tiny_train_config(
        run_dir, steps=steps, batch_size=4, seq_len=16, tensorboard=True,
        optimizer=OptimizerConfig(learning_rate=0.1, schedule="cosine", warmup_steps=2),
        checkpoint=CheckpointConfig(**{"every": 0, "save_at_end": True, "async_save": True, **ckpt}),
    )
    return Trainer(TableLM(np.zeros((VOCAB, VOCAB))), make_sft_loss(), cfg)


def test_resumed_run_reproduces_the_uninterrupted_run(tmp_path):
    """6 steps in one go vs 3 steps, stop, resume to 6: the same losses at every step, the same final weights."""
    loader = _loader()
    assert loader.batches_in_epoch(0) < 6
    whole = _trainer(tmp_path / "whole", 6)
    full = whole.fit(_loader())
    whole.close()

    first = _trainer(tmp_path / "split", 3)
    part1 = first.fit(_loader())
    first.close()
    assert part1.last_checkpoint.endswith(os.path.join("checkpoints", "3"))
    second = _trainer(tmp_path / "split", 6)
    part2 = second.fit(_loader())  # a fresh loader: its position comes from the checkpoint
    second.close()

    assert part2.resumed_from == 3
    assert [s for s, _ in part2.history] == [4, 5, 6]
    assert_allclose(part1.losses + part2.losses, full.losses, rtol=0, atol=0)
    for key, value in host(full.state.params).items():
        assert_allclose(host(part2.state.params)[key], value, rtol=0, atol=0)
    # metrics.jsonl got all six steps, with the resumed run appended.
    records = read_metrics(str(tmp_path / "split"))
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert_allclose([r["loss"] for r in records], full.losses, rtol=1e-6)


def test_checkpoints_keep_the_last_n_and_hold_everything(tmp_path):
    trainer = _trainer(tmp_path, 5, every=1, keep=2)
    trainer.fit(_loader())
    steps = trainer.checkpointer.all_steps()
    meta = trainer.checkpointer.read_meta()
    trainer.close()
    assert sorted(steps) == [4, 5]
    folder = tmp_path / "checkpoints" / "5"
    assert {"params", "opt_state", "train", "data", "meta"} <= set(os.listdir(folder))
    assert not [n for n in os.listdir(tmp_path / "checkpoints") if "tmp" in n]  # no half-written folders left
    assert meta["trainable"] == "full" and meta["keys"] == ["table"]
    data = json.loads((folder / "data" / "metadata").read_text())
    assert {"epoch", "batch", "seed"} <= set(data)


def test_metrics_files_and_hook_cadence(tmp_path):
    calls = []

    class Counting(Hook):
        def __init__(self):
            super().__init__(every=2, at_end=True)
            self.started = self.ended = 0

        def start(self, trainer):
            self.started += 1

        def __call__(self, info):
            calls.append((info.step, info.is_last, round(info.metrics()["loss"], 6)))

        def end(self, trainer):
            self.ended += 1

    hook = Counting()
    trainer = _trainer(tmp_path, 5, save_at_end=False)
    result = trainer.fit(_loader(), hooks=[hook, every(3, lambda info: calls.append(("every3", info.step)))],
                         eval_batches=lambda: [next(iter(_loader()))])
    trainer.close()
    assert [c[0] for c in calls if c[0] != "every3"] == [2, 4, 5] and calls[-1] != ("every3", 5)
    assert ("every3", 3) in calls
    assert hook.started == hook.ended == 1
    records = read_metrics(str(tmp_path))
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5]
    assert {"loss", "grad_norm", "lr", "num_tokens", "token_accuracy"} <= set(train[0])
    assert "tokens_per_s" in train[-1]
    evals = [r for r in records if "eval/loss" in r]
    assert [r["step"] for r in evals] == [5] and result.eval_history[0][0] == 5
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(tmp_path / "tb"))
    assert not (tmp_path / "checkpoints").exists()


def test_eval_at_start_gives_the_before_figure(tmp_path):
    """eval_at_start evaluates the untouched model at step 0: the zero-table model predicts a uniform
    distribution, so its held-out loss is exactly log(VOCAB); training lowers it by the end."""
    cfg = tiny_train_config(tmp_path, steps=4, batch_size=4, seq_len=16, eval_at_start=True,
                            optimizer=OptimizerConfig(learning_rate=0.1, schedule="constant"))
    trainer = Trainer(TableLM(np.zeros((VOCAB, VOCAB))), make_sft_loss(), cfg)
    result = trainer.fit(_loader(), eval_batches=lambda: [next(iter(_loader()))])
    trainer.close()
    assert [step for step, _ in result.eval_history] == [0, 4]
    assert_allclose(result.eval_history[0][1]["loss"], np.log(VOCAB), rtol=1e-5)
    assert result.eval_history[1][1]["loss"] < result.eval_history[0][1]["loss"]


def test_learning_rate_schedule_in_the_metrics(tmp_path):
    """Cosine with 2 warm-up steps over 6, peak 0.1: steps 0..5 use 0.05, 0.1, then 0.1 (1 + cos(pi k / 4)) / 2
    for k = 0..3: 0.1, 0.085355, 0.05, 0.014645."""
    trainer = _trainer(tmp_path, 6, save_at_end=False)
    result = trainer.fit(_loader())
    trainer.close()
    expected = [0.05, 0.1, 0.1, 0.0853553, 0.05, 0.0146447]
    assert_allclose([m["lr"] for _, m in result.history], expected, rtol=1e-5)


def test_a_hook_that_raises_stop_ends_the_run_with_a_checkpoint_and_the_reason(tmp_path):
    """A hook raising StopTraining after step 2 of 6: the loop stops there, saves checkpoint 2 although
    save_at_end is off and `every` is 0, logs step 2 (log_every=4 would not have) with `stop_reason`, writes the
    reason to summary.json and returns it; hooks after the stopper run as at the end (the end-only eval runs)."""
    from tempax.train.hooks import StopTraining

    def stop(info):
        if info.step == 2:
            raise StopTraining("loss looks fine, stop")

    cfg = tiny_train_config(tmp_path, steps=6, batch_size=4, seq_len=16, log_every=4,
                            checkpoint=CheckpointConfig(every=0, save_at_end=False, async_save=False))
    trainer = Trainer(TableLM(np.zeros((VOCAB, VOCAB))), make_sft_loss(), cfg)
    result = trainer.fit(_loader(), hooks=[every(1, stop)], eval_batches=lambda: [next(iter(_loader()))])
    trainer.close()
    assert result.stop_reason == "loss looks fine, stop"
    assert [s for s, _ in result.history] == [2] and result.history[0][1]["stop_reason"] == result.stop_reason
    assert [s for s, _ in result.eval_history] == [2]
    assert result.last_checkpoint.endswith(os.path.join("checkpoints", "2"))
    assert os.listdir(tmp_path / "checkpoints") == ["2"]
    records = read_metrics(str(tmp_path))
    assert [(r["step"], r.get("stop_reason")) for r in records if "loss" in r] == [(2, "loss looks fine, stop")]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {"step": 2, "steps": 6, "resumed_from": 0, "stop_reason": "loss looks fine, stop",
                       "last_checkpoint": result.last_checkpoint}


def test_request_stop_from_outside_the_hooks(tmp_path):
    """`Trainer.request_stop` (what a signal handler calls) during step 3 ends the run after step 3."""
    cfg = tiny_train_config(tmp_path, steps=6, batch_size=4, seq_len=16)
    trainer = Trainer(TableLM(np.zeros((VOCAB, VOCAB))), make_sft_loss(), cfg)

    class StopsDuringStep3:
        def __iter__(self):
            for i, batch in enumerate(_loader()):
                if i == 2:
                    trainer.request_stop("asked to stop")
                yield batch

    result = trainer.fit(StopsDuringStep3())
    trainer.close()
    assert result.stop_reason == "asked to stop" and [s for s, _ in result.history] == [1, 2, 3]
    assert result.last_checkpoint.endswith(os.path.join("checkpoints", "3"))


def test_the_final_evaluation_shows_a_labelled_bar(tmp_path, capsys, monkeypatch):
    """After step 3 the training bar is full while the held-out batches run: a bar of its own says what the wait
    is (held-out eval at step 3) and counts its 2 batches."""
    import tempax.progress

    monkeypatch.setattr(tempax.progress, "on_terminal", lambda: True)
    cfg = tiny_train_config(tmp_path, steps=3, batch_size=4, seq_len=16, progress_bar=True)
    trainer = Trainer(TableLM(np.zeros((VOCAB, VOCAB))), make_sft_loss(), cfg)
    batches = [next(iter(_loader())), next(iter(_loader()))]
    trainer.fit(_loader(), eval_batches=lambda: batches)
    trainer.close()
    err = capsys.readouterr().err
    assert "held-out eval at step 3:   0%|" in err and "0/2 [" in err


@pytest.mark.parametrize("cache_on", [True, False])
def test_with_jax_cache_the_freed_heap_is_handed_back_after_the_first_step_only(tmp_path, monkeypatch, cache_on):
    """With JAX's persistent cache on, the first step's call loads the step and leaves freed heap behind:
    `release_free_heap` is called once, within that call; later steps call nothing. Without the cache: never."""
    import tempax.train.loop as loop

    events: list[str] = []
    trainer = _trainer(str(tmp_path), steps=3)
    dispatched = trainer.train_step

    def marked_step(batch):
        metrics = dispatched(batch)
        events.append("step")
        return metrics

    monkeypatch.setattr(loop, "jax_cache_in_use", lambda: cache_on)
    monkeypatch.setattr(loop, "release_free_heap", lambda: events.append("release") or True)
    monkeypatch.setattr(trainer, "train_step", marked_step)
    trainer.fit(_loader())
    assert events == (["release"] if cache_on else []) + ["step", "step", "step"]


def test_xla_running_out_of_device_memory_ends_as_the_plan_and_the_settings_that_fit(tmp_path):
    """XLA's RESOURCE_EXHAUSTED from the step (at compile or at run time, both raised by the call) becomes one
    DeviceOutOfMemory (exit status 2 in the CLI): XLA's own line, the plan, and settings sized by XLA's figure (5%
    over the capacity here). A trainer of shapes only plans and compiles but refuses to train."""
    import jax
    from flax import nnx

    from tempax.errors import DeviceOutOfMemory, TempaxError
    from tempax.train import memory as mem
    from tests.kit.models import tiny_tempax_model
    from tests.train.helpers import random_batch

    trainer = Trainer(tiny_tempax_model("llama"), make_sft_loss(), tiny_train_config(tmp_path, check_memory=True))
    needed = trainer._capacity * 1.05
    message = (f"RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used {needed / 2**30:.3f}G of "
               f"{trainer._capacity / 2**30:.3f}G hbm.")

    def out_of_memory(*args):
        raise jax.errors.JaxRuntimeError(message)

    trainer._step = out_of_memory
    with pytest.raises(DeviceOutOfMemory) as info:
        trainer.train_step(random_batch(8, 16, vocab=128))
    text = str(info.value)
    assert "Ran out of memory" in text and "memory plan per device" in text
    assert "it would fit with" in text or "nothing tried fits" in text
    assert text.count("\n") == 0 and trainer.step == 0

    shapes = Trainer(nnx.eval_shape(lambda: tiny_tempax_model("llama")), make_sft_loss(), tiny_train_config(tmp_path))
    assert shapes.abstract and shapes.memory_plan().total > 0
    assert shapes.step_memory(random_batch(8, 16, vocab=128)).temp_size_in_bytes > 0
    with pytest.raises(TempaxError, match="shapes only"):
        shapes.train_step(random_batch(8, 16, vocab=128))
    assert isinstance(mem.explain_out_of_memory(RuntimeError(message), trainer._plan_inputs, 8, trainer._capacity),
                      DeviceOutOfMemory)


def test_the_first_batch_is_planned_with_the_losss_own_activations_before_it_compiles(tmp_path):
    """The first step's batch gives the plan this loss's own residuals on one micro-batch of its shapes (SFT's:
    within 15% of the decoder's); a capacity it cannot fit stops the run there, naming settings, before any
    compilation, and with the step count untouched."""
    from tempax.train.memory import OutOfMemoryPlan
    from tests.kit.models import tiny_tempax_model
    from tests.train.helpers import random_batch

    trainer = Trainer(tiny_tempax_model("llama"), make_sft_loss(), tiny_train_config(tmp_path, check_memory=True))
    batch = random_batch(8, 16, vocab=128)
    first, planned = trainer.memory_plan(), trainer.memory_plan(batch)
    assert planned.activations == pytest.approx(first.activations, rel=0.15)
    trainer._capacity = planned.total // 2
    with pytest.raises(OutOfMemoryPlan, match="the train step on these batches needs"):
        trainer.train_step(batch)
    assert trainer.step == 0
