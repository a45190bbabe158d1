"""A recipe's memory plan before any weight is loaded (`tempax validate RECIPE --memory-gib N`): what it reads from
the recipe, checked against the model the run would build."""

from __future__ import annotations

import jax
from flax import nnx

from tempax.algorithms.recipe_memory import recipe_memory, recipe_plan_inputs
from tempax.algorithms.registry import load_recipe
from tempax.models.decoder import Decoder
from tempax.models.lora import LoraConfig, apply_lora
from tempax.models.presets import get_preset
from tempax.train import memory as mem
from tests.cli.test_validate import _sft_recipe


def test_the_plan_inputs_are_the_runs_own(tmp_path):
    """QLoRA rank 8 on two projections of tiny-llama: the trainable count is the adapters' (as the built model
    holds them), the frozen bytes per parameter average the NF4 kernels with the float32 embedding and norms,
    the SFT loss's chunk (64 positions) sizes the logits, and the train section gives the rest."""
    body = "lora:\n  rank: 8\n  target_modules: [q_proj, v_proj]\n  quantize_base: nf4\n"
    recipe = _sft_recipe(tmp_path, "preset:tiny-llama", body)
    cfg = load_recipe("sft", recipe, ["train.batch_size=4", "train.micro_batch_size=2", "train.seq_len=32",
                                      "train.remat=dots", "train.precision=bf16"])
    p = recipe_plan_inputs(cfg, "sft", backend="cpu")
    built = apply_lora(Decoder(get_preset("tiny-llama"), rngs=nnx.Rngs(0)),
                       LoraConfig(rank=8, target_modules=("q_proj", "v_proj"), quantize_base="nf4"), rngs=nnx.Rngs(1))
    adapters = sum(x.size for x in jax.tree.leaves(nnx.state(built, nnx.LoRAParam)))
    assert p.trainable_params == adapters
    assert 0.5 < p.frozen_bytes_per_param < 4
    assert (p.micro_batch_size, p.num_micro_batches, p.seq_len, p.remat, p.precision, p.loss_chunk_len) == (
        2, 2, 32, "dots", "bf16", 64)
    assert p.probe is not None and p.probe("dots") > 0 and not p.host_is_separate


def test_a_plan_that_does_not_fit_names_what_would(tmp_path):
    """Full fine-tuning of tiny-llama in 1 MiB cannot fit; the report says so in its last line, with settings."""
    cfg = load_recipe("sft", _sft_recipe(tmp_path, "preset:tiny-llama"), ["train.seq_len=64"])
    report = recipe_memory(cfg, "sft", 2**20, backend="cpu")
    assert not report.fits and report.lines()[-1].strip().startswith("does not fit")
    roomy = recipe_memory(cfg, "sft", 4 * mem.GiB, backend="cpu")
    assert roomy.fits and roomy.choice.setting == "device" and roomy.lines()[-1].strip().startswith("fits: ~")
