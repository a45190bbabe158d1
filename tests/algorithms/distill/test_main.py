"""Distillation on the shared training core: a tiny student learns a tiny teacher's distribution (KD vs CE alone),
sequence-level KD, the student/teacher set-up (pruned copy, vocabulary check, teacher storage), the memory plan."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numpy.testing import assert_allclose

from tempax.algorithms.distill.models import (
    StudentConfig,
    StudentTeacher,
    build_student,
    model_bytes,
    parameter_count,
    store_teacher,
    student_filter,
)
from tempax.algorithms.distill.sequence import SequenceKDConfig, prompt_turns, teacher_generations
from tempax.algorithms.distill.main import DistillConfig, main
from tempax.configlib import from_dict, to_dict
from tempax.data.sources import as_rows
from tempax.errors import ConfigError
from tempax.models.decoder import Decoder
from tempax.models.hf_io import save_hf_checkpoint
from tempax.models.presets import PRESETS
from tempax.train import memory as mem
from tempax.train.state import ModelParts
from tests.kit.models import random_ids, tiny_tempax_model
from tests.kit.tokenizers import tiny_chat_tokenizer

VOCAB = 400


def _rows(n: int) -> list[dict]:
    """Small arithmetic dialogues: 'What is 3 plus 4?' -> '3 plus 4 is 7.'"""
    out = []
    for i in range(n):
        a, b = i % 7, (3 * i) % 5
        out.append({"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                                 {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]})
    return out


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A 4-layer tiny-llama teacher with confident (peaked) next-token distributions: its (untied) LM head is scaled
    by 40, so logits spread with a standard deviation of ~6 instead of ~0.16. Saved as a Hugging Face folder with
    the tiny chat tokenizer, loadable like any model source."""
    folder = str(tmp_path_factory.mktemp("teacher"))
    teacher = Decoder(PRESETS["tiny-llama"].replace(vocab_size=VOCAB, num_layers=4), rngs=nnx.Rngs(7))
    teacher.lm_head.kernel.set_value(teacher.lm_head.kernel[...] * 40.0)
    save_hf_checkpoint(teacher, folder, tokenizer=tiny_chat_tokenizer())
    return folder


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(32)))
    return str(path)


def _config(tmp_path, teacher_dir, data_path, name="run", **changes) -> DistillConfig:
    raw = {
        "teacher": {"source": teacher_dir},
        "student": {"source": "preset:tiny-llama", "overrides": {"vocab_size": VOCAB, "num_layers": 2}},
        "data": {"path": data_path, "packing": False, "eval_fraction": 0.25},
        "loss": {"kind": "forward_kl", "alpha": 1.0, "chunk_len": 16},
        "save_student": False,
        "train": {"steps": 30, "batch_size": 4, "seq_len": 32, "progress_bar": False, "tensorboard": False,
                  "run_dir": str(tmp_path / name), "mesh": {"num_devices": 1}, "log_every": 30,
                  "eval_at_start": True, "seed": 0,
                  "optimizer": {"learning_rate": 1e-2, "schedule": "constant", "weight_decay": 0.0},
                  "checkpoint": {"save_at_end": False}},
    }
    for key, value in changes.items():
        section, field = key.split(".")
        raw[section] = {**raw.get(section, {}), field: value}
    return from_dict(DistillConfig, raw)


@pytest.mark.heavy
def test_kd_lowers_the_divergence_and_beats_ce_alone_on_agreement(tmp_path, teacher_dir, data_path):
    """The same 2-layer random-init student, data, seed and 30 steps, trained with the KD loss (alpha = 1) and with
    the label cross-entropy alone (alpha = 0). On the held-out rows, KD takes KL(teacher || student) to under a
    tenth of its start (measured: 4.85 -> 0.19), and its top-1 agreement with the teacher ends 0.3 above the
    CE-trained student's (measured: 0.74 vs 0.00)."""
    kd = main(_config(tmp_path, teacher_dir, data_path, "kd"), log=lambda _: None)
    ce = main(_config(tmp_path, teacher_dir, data_path, "ce", **{"loss.alpha": 0.0}), log=lambda _: None)
    (s0, kd_start), (s1, kd_end) = kd.eval_history[0], kd.eval_history[-1]
    ce_end = ce.eval_history[-1][1]
    assert (s0, s1) == (0, 30)
    assert kd_end["kd_loss"] < 0.1 * kd_start["kd_loss"], (kd_start, kd_end)
    assert kd_end["agreement"] > ce_end["agreement"] + 0.3, (kd_end, ce_end)
    assert kd_end["kd_loss"] < ce_end["kd_loss"]
    # Only the student was trained: checkpoint keys are the student's.
    assert kd.state.params and all(k.startswith("student.") for k in kd.state.params)


@pytest.mark.heavy
def test_pruned_copy_student_and_saved_student_folder(tmp_path, teacher_dir, data_path):
    """student.source=teacher keeping layers [0, 3]: training starts from those teacher layers (2 of 4), and the
    trained student is written as a folder `tempax.load` reads, with the student's layer count."""
    from tempax.models import registry

    cfg = _config(tmp_path, teacher_dir, data_path, "pruned", **{
        "student.source": "teacher", "student.keep_layers": [0, 3], "student.overrides": {},
        "train.steps": 2, "train.eval_at_start": False,
    })
    cfg = from_dict(DistillConfig, {**to_dict(cfg),
                                    "save_student": True})
    result = main(cfg, log=lambda _: None)
    sizes = result.extras["sizes"]
    assert (sizes["teacher_layers"], sizes["student_layers"]) == (4, 2)
    assert sizes["student_params"] < sizes["teacher_params"]
    student, tok = registry.load(result.extras["student_dir"])
    assert student.config.num_layers == 2 and tok is not None


@pytest.mark.slow
def test_sequence_kd_trains_on_the_teachers_answers(tmp_path, teacher_dir, data_path):
    """mode: sequence: the teacher answers 6 training prompts greedily; the file holds prompt/completion rows whose
    prompt is the row's user turn; a second run reuses the file; training runs on it."""
    cfg = _config(tmp_path, teacher_dir, data_path, "seq", **{
        "train.steps": 2, "train.eval_at_start": False, "train.log_every": 1,
    })
    raw = to_dict(cfg)
    raw["mode"] = "sequence"
    raw["sequence"] = {"max_prompts": 6, "max_new_tokens": 6, "batch_size": 4}
    raw["loss"]["alpha"] = 0.0
    cfg = from_dict(DistillConfig, raw)
    messages: list[str] = []
    result = main(cfg, log=messages.append)
    path = tmp_path / "seq" / "teacher_generations.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert 1 <= len(lines) <= 6
    assert all(r["prompt"][-1]["role"] == "user" and isinstance(r["completion"], str) for r in lines)
    assert len(result.losses) == 2
    main(cfg, log=messages.append)
    assert any("reusing" in m for m in messages)


def test_prompt_turns_and_rows_without_prompts():
    """Chat rows: the turns before the last assistant message; prompt/completion rows: the prompt as a user turn;
    text rows and assistant-first chats are skipped with their reason (and nothing left is a DataError)."""
    from tempax.data.formats import RowError
    from tempax.errors import DataError

    chat = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                         {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}
    assert [m["content"] for m in prompt_turns(chat)] == ["a", "b", "c"]
    assert prompt_turns({"prompt": "p", "completion": "q"}) == [{"role": "user", "content": "p"}]
    with pytest.raises(RowError):
        prompt_turns({"text": "plain"})
    with pytest.raises(DataError, match="none of the 1 rows"):
        teacher_generations(None, tiny_chat_tokenizer(), as_rows([{"text": "plain"}]), SequenceKDConfig(), max_len=64,
                            say=lambda _: None)


def test_vocabulary_mismatch_names_both_sizes(teacher_dir):
    """A preset student (vocabulary 128) of a 400-token teacher: the error names both sizes."""
    teacher = tiny_tempax_model(vocab_size=VOCAB)
    spec = StudentConfig(source="preset:tiny-llama")
    with pytest.raises(ConfigError, match=r"student's vocabulary has 128 tokens but the teacher's has 400"):
        build_student(spec, teacher, tokenizer_source=teacher_dir)


def test_student_spec_validation():
    with pytest.raises(ConfigError, match="student.overrides"):
        StudentConfig(source="teacher", overrides={"num_layers": 2}).validate()


@pytest.mark.parametrize("storage", ["bf16", "nf4"])
def test_teacher_storage_saves_bytes_and_keeps_outputs_close(storage):
    """bf16 halves the teacher's bytes; nf4 stores the projections in ~4.5 bits. Logits stay close to the float
    teacher's (bf16: relative 2e-2; nf4 on random weights: correlation > 0.9), and the float teacher is untouched."""
    teacher = tiny_tempax_model(seed=2, num_layers=2)
    tokens = jnp.asarray(random_ids((1, 8)))
    ref = np.asarray(teacher(tokens)[0])
    stored = store_teacher(teacher, storage)
    assert model_bytes(stored) < (0.6 if storage == "bf16" else 0.9) * model_bytes(teacher)
    assert parameter_count(stored) == parameter_count(teacher)
    out = np.asarray(stored(tokens)[0], np.float32)
    if storage == "bf16":
        assert_allclose(out, ref, rtol=2e-2, atol=2e-2)
    else:
        assert np.corrcoef(out.ravel(), ref.ravel())[0, 1] > 0.9
    assert_allclose(np.asarray(teacher(tokens)[0]), ref)


def test_memory_plan_counts_the_teacher():
    """A full-student StudentTeacher: every trainable array is the student's, so the split's frozen rest is the
    teacher; the plan with its bytes as extra_frozen_bytes grows by exactly those bytes (one device)."""
    student = tiny_tempax_model(seed=0, num_layers=1)
    teacher = tiny_tempax_model(seed=1, num_layers=3)
    pair = StudentTeacher(student, teacher)
    parts, params = ModelParts.split(pair, student_filter)
    rest_bytes = sum(int(x.nbytes) for x in jax.tree.leaves(parts.rest))
    assert rest_bytes == model_bytes(teacher)
    assert sum(int(v.size) for v in params.values()) == student.config.num_params()
    base = mem.PlanInputs(model=student.config, micro_batch_size=2, seq_len=16,
                          trainable_params=student.config.num_params())
    with_teacher = mem.PlanInputs(**{**base.__dict__, "extra_frozen_bytes": rest_bytes})
    assert mem.plan_memory(with_teacher).weights - mem.plan_memory(base).weights == rest_bytes


# ------------------------------------------------------------------------------------------------------------
# On-policy GKD batches


def test_completion_batch_trains_the_completion_only():
    """Prompt [5, 6, 7] + completion [8, 9] in a row of 8: tokens 5 6 7 8 9 0 0 0; targets are the next tokens;
    the loss mask is on the positions predicting 8 and 9 (indices 2 and 3); the second row is padding."""
    from tempax.algorithms.distill.gkd import completion_batch

    batch = completion_batch([[5, 6, 7]], [[8, 9]], seq_len=8, pad_id=0, num_rows=2)
    assert batch["tokens"][0].tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert batch["targets"][0, :4].tolist() == [6, 7, 8, 9]
    assert batch["loss_mask"][0].tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
    assert batch["segment_ids"][0].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    assert batch["loss_mask"][1].sum() == 0


def test_gkd_draws_on_policy_batches_with_probability_lambda_reproducibly():
    """Over 2000 batches about lambda of them are on-policy; 0 and 1 give none and all; the draws depend only on
    (seed, batch index), so a restored source continues with the same choices and prompt order."""
    from tempax.algorithms.distill.gkd import GKDSource, OnPolicyConfig

    def source(lmbda, seed=0):
        return GKDSource(iter(()), [[1], [2], [3]], None, OnPolicyConfig(lmbda=lmbda), batch_size=2, seq_len=8,
                         pad_id=0, seed=seed)

    frac = np.mean([source(0.3).is_on_policy(i) for i in range(2000)])
    assert 0.27 < frac < 0.33
    assert not any(source(0.0).is_on_policy(i) for i in range(200))
    assert all(source(1.0).is_on_policy(i) for i in range(200))
    a = source(0.5)
    first = [a._next_prompts() for _ in range(2)]
    b = source(0.5)
    b.restore({"drawn": 0, "prompt_pos": 4, "offline": None})
    a_next, b_next = a._next_prompts(), b._next_prompts()
    assert a_next == b_next and len(first) == 2
    with pytest.raises(ConfigError, match="lmbda"):
        OnPolicyConfig(lmbda=1.5).validate()


@pytest.mark.slow
def test_on_policy_mode_trains_on_student_samples(tmp_path, teacher_dir, data_path):
    """mode: on_policy with lambda = 1 on the one loop: `fit` attaches the source, every batch is the student's own
    samples (2 steps) scored by the teacher, and the source's metrics join each step's record."""
    cfg = _config(tmp_path, teacher_dir, data_path, "gkd", **{
        "train.steps": 2, "train.eval_at_start": False, "train.log_every": 1, "train.seq_len": 64,
    })
    raw = to_dict(cfg)
    raw["mode"] = "on_policy"
    raw["on_policy"] = {"lmbda": 1.0, "max_new_tokens": 8}
    raw["loss"]["kind"] = "jsd"
    result = main(from_dict(DistillConfig, raw), log=lambda _: None)
    assert len(result.losses) == 2 and all(np.isfinite(result.losses))
    for _, record in result.history:
        assert record["gkd/on_policy"] == 1.0 and 1 <= record["gkd/completion_len"] <= 8


def test_validate_checks_the_teacher_and_student_sources(monkeypatch):
    """`tempax validate` resolves both models of a distillation recipe (student.source=teacher is the copy)."""
    from tempax.algorithms.validate import check_recipe

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    monkeypatch.chdir(root)
    command, cfg, _ = check_recipe("recipes/distill_smollm2.yaml")
    assert command == "distill" and cfg.student.source == "teacher"
    with pytest.raises(ConfigError, match="teacher.source: unknown model 'smolm2'"):
        check_recipe("recipes/distill_smollm2.yaml", ["teacher.source=smolm2"])
    with pytest.raises(ConfigError, match="student.source: unknown model"):
        check_recipe("recipes/distill_smollm2.yaml", ["student.source=nope-7b"])


@pytest.mark.heavy
def test_micro_batches_give_the_full_batch_step():
    """One step on 4 ragged rows as one pass vs 2 micro-batches of 2: the token-weighted accumulation (loss_weight
    = supervised tokens) gives the same loss, KD metrics, gradient norm and updated student weights."""
    from tempax.algorithms.distill.main import DistillLossConfig, make_distill_loss
    from tempax.train.loop import Trainer
    from tests.train.helpers import host, random_batch, tiny_train_config
    from tempax.train.config import OptimizerConfig

    batch = random_batch(4, 16, seed=3)
    loss_fn = make_distill_loss(DistillLossConfig(kind="jsd", temperature=2.0, alpha=0.5, top_k=8, chunk_len=4))
    sgd = OptimizerConfig(name="sgd", learning_rate=1.0, schedule="constant", weight_decay=0.0, grad_clip_norm=None)
    out = []
    for micro in (None, 2):
        pair = StudentTeacher(tiny_tempax_model(seed=0, num_layers=1), tiny_tempax_model(seed=1, num_layers=2))
        # SGD at lr 1: the update is minus the gradient, so comparing weights compares gradients (Adam would turn
        # rounding of a ~0 gradient into a +-lr step).
        trainer = Trainer(pair, loss_fn, tiny_train_config(batch_size=4, micro_batch_size=micro, optimizer=sgd),
                          trainable=student_filter, log=lambda _: None)
        metrics = host(trainer.train_step(batch))
        out.append((metrics, host(trainer.state.params)))
    (m1, p1), (m2, p2) = out
    assert trainer.num_micro_batches == 2
    for key in ("loss", "kd_loss", "ce_loss", "agreement", "num_tokens"):
        assert_allclose(m1[key], m2[key], rtol=1e-5, err_msg=key)
    assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-5)
    for key in p1:
        assert_allclose(p1[key], p2[key], atol=1e-6, err_msg=key)


def test_lora_student_trains_only_its_adapters():
    """With `lora:` the trainable arrays are the student's adapters; the student's base and the teacher are frozen."""
    from tempax.algorithms.distill.models import student_lora_filter
    from tempax.models.lora import LoraConfig, apply_lora

    student = apply_lora(tiny_tempax_model(seed=0, num_layers=1), LoraConfig(rank=2), rngs=nnx.Rngs(0))
    teacher = apply_lora(tiny_tempax_model(seed=1, num_layers=1), LoraConfig(rank=2), rngs=nnx.Rngs(1))
    _, params = ModelParts.split(StudentTeacher(student, teacher), student_lora_filter())
    assert params and all(k.startswith("student.") and ".lora_" in k for k in params)
