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


@pytest.mark.heavy
def test_a_mixture_of_experts_gets_lora_on_its_experts_on_attention_or_qlora_by_memory(tmp_path):
    """Qwen3-30B-A3B (P = 30,532,122,624 float32 parameters, 3.35B active per token) with lots of data, LoRA rank 16.

    Adapters, by hand (48 layers; attention q/o [2048, 4096], k/v [2048, 512]; 128 experts, gate_up [2048, 2 x 768],
    down [768, 2048]):
      attention  48 x 16 x ((2048 + 4096) x 2 + (2048 + 512) x 2) = 13,369,344
      experts    48 x 128 x 16 x ((2048 + 1536) + (768 + 2048))    = 629,145,600  (total 642,514,944)
    Weights on the device, the base whole beside the float32 adapters:
      LoRA on attention and experts   (P + 642,514,944) x 4        = 116.13 GiB
      LoRA on attention only          (P + 13,369,344) x 4         = 113.79 GiB
      QLoRA on attention and experts  P x 0.5625 + 642,514,944 x 4 = 18.39 GiB
      QLoRA on attention only         P x 0.5625 + 13,369,344 x 4  = 16.04 GiB
    Full fine-tuning (~16 bytes a parameter: 455 GiB before activations) fits 600 GiB; 150 GiB takes LoRA on the
    experts too; 140 GiB only attention LoRA (the experts' 629M adapters add 629M x 16 bytes = 9.4 GiB of master,
    gradient and moments, past 85% of 140 GiB); 40 GiB QLoRA with expert adapters, 20 GiB QLoRA on attention."""
    moe = get_preset("qwen3-30b-a3b")
    total = moe.num_params()
    assert total == 30_532_122_624
    p = _profile(tmp_path, "messages", rows=100_000, tokens_per_row=400)

    def rec(capacity_gib):
        return recommend(p, moe, model_source="Qwen/Qwen3-30B-A3B", capacity=capacity_gib * GiB)

    assert rec(600).adaptation == "full"
    default = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    attention = ["q_proj", "k_proj", "v_proj", "o_proj"]
    cases = {150: ("lora", default, 642_514_944, (total + 642_514_944) * 4),
             140: ("lora", attention, 13_369_344, (total + 13_369_344) * 4),
             40: ("qlora", default, 642_514_944, total * 0.5625 + 642_514_944 * 4),
             20: ("qlora", attention, 13_369_344, total * 0.5625 + 13_369_344 * 4)}
    for capacity, (adaptation, targets, adapters, weights) in cases.items():
        r = rec(capacity)
        assert r.fits and r.adaptation == adaptation, capacity
        assert r.recipe["lora"]["target_modules"] == targets
        assert r.hyperparameters["adapter_params"] == adapters
        assert r.plan.weights == pytest.approx(weights, abs=16)
        accumulating = r.hyperparameters["micro_batch_size"] < 16  # a float32 accumulator beside the gradients
        assert r.plan.gradients == adapters * 4 * (2 if accumulating else 1)
        assert r.plan.optimizer == adapters * 8
        assert r.recipe["lora"].get("quantize_base") == ("nf4" if adaptation == "qlora" else None)
        assert r.method.endswith("on attention only") == (targets == attention)
    why = " ".join(rec(150).reasons)
    assert "642.5M adapter parameters: 13.4M on projections, 629.1M on the routed experts" in why
    assert "each of the 128 experts of a layer has its own A and B" in why
    why = " ".join(rec(140).reasons)
    assert "LoRA on the attention projections only (q_proj, k_proj, v_proj, o_proj: 13.4M adapter parameters)" in why
    assert "LoRA on the routed experts too (642.5M adapter parameters" in why and "over 85% of 140.00 GiB" in why
    why = rec(20).reasons
    assert any("30532M-parameter mixture of experts (3353M active per token, 8 of 128 experts)" in r for r in why)
    assert any("LoRA does not fit either" in r for r in why)
    assert any("experts included, is stored in 4 bits" in r for r in why)


def test_a_tiny_mixture_of_experts_recipe_adapts_its_experts_and_validates(tmp_path):
    """tiny-qwen3-moe (3 layers, hidden 64, 6 experts of inner 32; attention q/o [64, 64], k/v [64, 32]) in plenty of
    memory: LoRA on LoRA's default targets, which adapt the routed experts, rank 16:
      attention 3 x 16 x ((64 + 64) x 2 + (64 + 32) x 2) = 21,504
      experts   3 x 6 x 16 x ((64 + 64) + (32 + 64))      = 64,512
    and the recipe it writes is accepted by `tempax validate`."""
    tiny = get_preset("tiny-qwen3-moe")
    p = _profile(tmp_path, "messages", rows=200, tokens_per_row=40)
    r = recommend(p, tiny, model_source="preset:tiny-qwen3-moe", capacity=8 * GiB, run_dir=str(tmp_path / "run"))
    assert r.adaptation == "lora" and r.hyperparameters["adapter_params"] == 21_504 + 64_512
    path = write_recipe(r, str(tmp_path / "rec.yaml"))
    command, cfg, _ = check_recipe(path)
    assert command == "sft" and cfg.lora.dropout == 0.0
    assert cfg.lora.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
