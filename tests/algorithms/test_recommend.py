"""`tempax recommend`: the decision for each data kind, full vs LoRA vs QLoRA by data size and memory, and the
recipe it writes passing `tempax validate`."""

from __future__ import annotations

import json

import pytest

from tempax.algorithms import registry
from tempax.algorithms.recommend import FULL_FT_MIN_TOKENS, recommend, write_recipe
from tempax.algorithms.registry import Algorithm
from tempax.algorithms.sft.recommend import SFTRecommender
from tempax.algorithms.validate import check_recipe
from tempax.data.stats import DataProfile
from tempax.models.presets import get_preset
from tempax.train.memory import GiB

SMOL = get_preset("smollm2-135m")


# One well-formed row per data kind: `tempax validate` reads a recipe's first data rows as the run will.
ROW_OF_KIND = {
    "text": {"text": "Some plain text."},
    "messages": {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
    "prompt_completion": {"prompt": "2 + 2 =", "completion": " 4"},
    "preference": {"prompt": "Hi", "chosen": "Hello.", "rejected": "Go away."},
    "qa": {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"},
}


def _profile(tmp_path, kind, rows=2000, tokens_per_row=300.0, checkable=0.0, name="data.jsonl"):
    path = tmp_path / name
    path.write_text(json.dumps(ROW_OF_KIND.get(kind, {})) + "\n")
    return DataProfile(path=str(path), split=None, kind=kind, rows=rows, sample_rows=min(rows, 300),
                       tokens_per_row=tokens_per_row, p95_tokens=480, loss_token_share=0.6,
                       checkable_fraction=checkable)


@pytest.mark.parametrize("kind,checkable,command", [
    ("text", 0.0, "pretrain"),
    ("messages", 0.0, "sft"),
    ("prompt_completion", 0.0, "sft"),
    ("preference", 0.0, "dpo"),
    ("qa", 1.0, "grpo"),
    ("qa", 0.5, "pretrain"),
])
def test_decision_per_data_kind(tmp_path, kind, checkable, command, monkeypatch):
    """Small data (0.6M tokens) and plenty of memory: the method follows the data kind, with LoRA; the recipe it
    writes is accepted by `tempax validate` for that command."""
    monkeypatch.chdir(tmp_path)
    p = _profile(tmp_path, kind, checkable=checkable)
    rec = recommend(p, SMOL, model_source="smollm2-135m-instruct", capacity=64 * GiB)
    assert rec.command == command and rec.adaptation == "lora" and rec.fits
    assert any("LoRA rather than full" in r for r in rec.reasons)
    path = write_recipe(rec, str(tmp_path / "rec.yaml"))
    got, cfg, _ = check_recipe(path)
    assert got == command and cfg.lora is not None and cfg.lora.rank == 16
    assert cfg.train.optimizer.learning_rate == rec.hyperparameters["learning_rate"]
    if command == "dpo":
        assert any("reward model + PPO" in a for a in rec.alternatives)
        assert cfg.dpo.reference == "adapters_off"
        assert cfg.data.eval_path is None and cfg.data.eval_fraction == 0.02  # not HH-RLHF's test file
    if command == "grpo":
        assert cfg.task.name == "gsm8k" and cfg.grpo.group_size == 8
    if kind == "qa" and command == "pretrain":
        assert cfg.data.text_fields == ("question", "answer")


def test_lots_of_data_and_memory_recommends_full_fine_tuning(tmp_path):
    p = _profile(tmp_path, "messages", rows=100_000, tokens_per_row=400)
    assert p.total_tokens >= FULL_FT_MIN_TOKENS
    rec = recommend(p, SMOL, model_source="smollm2-135m-instruct", capacity=64 * GiB)
    assert rec.adaptation == "full" and rec.command == "sft" and "lora" not in rec.recipe
    assert rec.hyperparameters["learning_rate"] == 2e-5


def test_model_too_big_for_full_fine_tuning_gets_lora(tmp_path):
    """Llama-3.1-8B with lots of data in 48 GiB: full fine-tuning needs ~16 bytes a parameter (8.0B x 16 = 120
    GiB before activations), so LoRA (30 GiB of float32 base weights); in 20 GiB LoRA does not fit either, so
    QLoRA (a 4-bit base, ~4.2 GiB)."""
    big = get_preset("llama3.1-8b")
    p = _profile(tmp_path, "messages", rows=100_000, tokens_per_row=400)
    rec = recommend(p, big, model_source="smollm2-135m-instruct", capacity=48 * GiB)
    assert rec.adaptation == "lora" and rec.fits
    assert any("does not fit" in r for r in rec.reasons)
    rec = recommend(p, big, model_source="smollm2-135m-instruct", capacity=20 * GiB)
    assert rec.adaptation == "qlora" and rec.fits and rec.recipe["lora"]["quantize_base"] == "nf4"
    assert rec.hyperparameters["micro_batch_size"] <= rec.hyperparameters["batch_size"]
    rec = recommend(p, big, model_source="smollm2-135m-instruct", capacity=1 * GiB)
    assert rec.adaptation == "qlora" and not rec.fits and "nothing fits" in rec.warnings[0]


def test_memory_picks_micro_batch_and_remat(tmp_path):
    """With too little memory for the whole batch at once, the recipe accumulates gradients and/or recomputes
    activations, and the predicted peak stays under the capacity."""
    p = _profile(tmp_path, "messages")
    roomy = recommend(p, SMOL, model_source="smollm2-135m-instruct", capacity=64 * GiB)
    tight = recommend(p, SMOL, model_source="smollm2-135m-instruct", capacity=3 * GiB)
    assert roomy.hyperparameters["micro_batch_size"] == 16 and roomy.hyperparameters["remat"] == "none"
    assert (tight.hyperparameters["micro_batch_size"], tight.hyperparameters["remat"]) != (16, "none")
    assert tight.peak_bytes <= 3 * GiB


class PlainTextRecommender(SFTRecommender):
    """A recommend hook from outside the packaged algorithms: it claims raw text, which only the fallback
    (continued pre-training) claims otherwise."""

    command = "toy-text"
    method = "toy training on text"

    def suits(self, profile: DataProfile) -> tuple[list[str], list[str]] | None:
        return (["the toy claims raw text"], []) if profile.kind == "text" else None


TOY_TEXT = PlainTextRecommender()


def test_a_registered_algorithms_hook_is_asked_like_the_packaged_ones(tmp_path):
    """A record registered with a `recommend` hook is proposed for the data its hook claims, ahead of the fallback,
    with nothing added to the recommend module; other data still goes where it went."""
    toy = registry.register(Algorithm("toy-text", "a toy", config="tempax.algorithms.sft.main:SFTConfig",
                                      main="tempax.algorithms.sft.main:main", recommend=f"{__name__}:TOY_TEXT"))
    try:
        rec = recommend(_profile(tmp_path, "text"), SMOL, model_source="smollm2-135m-instruct", capacity=64 * GiB)
        assert rec.command == "toy-text" and rec.reasons[0] == "the toy claims raw text"
        assert rec.method == "toy training on text with LoRA (rank 16)"
        other = recommend(_profile(tmp_path, "qa", checkable=0.5), SMOL, model_source="smollm2-135m-instruct",
                          capacity=64 * GiB)
        assert other.command == "pretrain"
    finally:
        registry.unregister(toy.command)


def test_a_mixture_of_experts_gets_attention_lora_or_qlora_by_memory(tmp_path):
    """Qwen3-30B-A3B (30.5B parameters, 3.35B active per token) with lots of data. Full fine-tuning needs ~16 bytes
    a parameter of all its experts (30.5B x 16 = 455 GiB before activations), so it fits in 600 GiB only; in 160
    GiB LoRA fits (the float32 base, 30.5B x 4 = 113.7 GiB), its adapters on the attention projections alone (no
    LoRA on stacked experts); in 40 GiB only QLoRA (30.5B x 0.5625 = 16 GiB, the experts in 4 bits too); the
    reasons name the total and active parameters."""
    moe = get_preset("qwen3-30b-a3b")
    p = _profile(tmp_path, "messages", rows=100_000, tokens_per_row=400)
    assert recommend(p, moe, model_source="Qwen/Qwen3-30B-A3B", capacity=600 * GiB).adaptation == "full"
    lora = recommend(p, moe, model_source="Qwen/Qwen3-30B-A3B", capacity=160 * GiB)
    assert lora.adaptation == "lora" and lora.fits
    assert lora.recipe["lora"]["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert 113.5 * GiB < lora.plan.weights < 114 * GiB
    qlora = recommend(p, moe, model_source="Qwen/Qwen3-30B-A3B", capacity=40 * GiB)
    assert qlora.adaptation == "qlora" and qlora.fits and qlora.recipe["lora"]["quantize_base"] == "nf4"
    assert 15.9 * GiB < qlora.plan.weights < 16.1 * GiB
    assert any("30532M-parameter mixture of experts (3353M active per token, 8 of 128 experts)" in r
               for r in qlora.reasons)
    assert any("LoRA adapts the attention projections" in r and "4 bits" in r for r in qlora.reasons)
