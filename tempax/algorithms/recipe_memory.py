"""The memory plan of a recipe for a device of a given size, before any weight is loaded or any step compiled
(`tempax validate RECIPE --memory-gib N`).

The model's shape comes from its source as `tempax model-info` reads it (a preset, a config.json, a GGUF header,
a training run's chain of configs); LoRA / QLoRA adapters and quantized bases are applied to a model of shapes
only (`nnx.eval_shape`), so the trainable count and the frozen bytes are the run's own; the rest is `train:` (batch,
micro-batch, seq_len, precision, remat, optimizer, memory). The plan is `tempax.train.memory`'s, with
`train.memory: auto` settled as a run settles it, for one device of the given size (per device of a mesh: the
recipe's fsdp / tensor axes split what they split). Rows are `train.seq_len` tokens, their logits held whole or,
with a chunked loss, `loss.chunk_len` positions at a time; an on-policy run's rows (a prompt and its completions)
and what an algorithm holds beside the trained model (a frozen reference copy, a reward model) are sized by the
run's own plan, printed before it compiles.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

from flax import nnx

from tempax.algorithms.registry import get
from tempax.errors import ConfigError, TempaxError
from tempax.models.config import ModelConfig
from tempax.models.decoder import Decoder
from tempax.models.lora import apply_lora
from tempax.models.registry import inspect_model, is_run_dir
from tempax.train import memory as mem

# The model sections a trained model is read from, in this order (a distillation trains its student).
TRAINED_SECTIONS = ("model", "student", "policy")


@dataclass(frozen=True)
class RecipeMemory:
    """The plan of a recipe on a device of `capacity` bytes.

    Attributes:
      inputs: what the plan was made from (`train.memory` settled).
      choice: the `train.memory` setting, its plan and why.
      fixes: settings that would fit when the plan does not (empty when it fits).
      capacity: the device's bytes.
    """

    inputs: mem.PlanInputs
    choice: mem.MemoryChoice
    fixes: tuple[str, ...]
    capacity: int

    @property
    def fits(self) -> bool:
        return self.choice.plan.fits

    def lines(self) -> list[str]:
        p = self.inputs
        head = (f"memory plan for a device of {self.capacity / mem.GiB:.2f} GiB ({p.backend} ops; micro-batch "
                f"{p.micro_batch_size} x {p.seq_len} tokens, {p.model.num_params() / 1e6:.0f}M parameters, "
                f"{'all' if p.trainable_params is None else f'{p.trainable_params / 1e6:.2f}M'} trained):")
        verdict = (f"fits: ~{self.choice.plan.total / mem.GiB:.2f} GiB of {self.capacity / mem.GiB:.2f} GiB" if self.fits
                   else "does not fit" + ("; it would fit with: " + "; or ".join(self.fixes) if self.fixes else
                                          "; nothing tried fits (train.memory, a smaller micro-batch, remat, "
                                          "LoRA/QLoRA): use more devices (mesh.fsdp) or a shorter seq_len"))
        return [head, f"  {self.choice.reason}", f"  {self.choice.plan.format()}", f"  {verdict}"]


def trained_section(command: str) -> str:
    """The recipe section of the model a command trains."""
    models = get(command).models
    return next((s for s in TRAINED_SECTIONS if s in models), models[0])


def source_config(section: str, model: Any) -> ModelConfig:
    """The `ModelConfig` a model section's source names (its overrides applied), read without weights."""
    source, overrides = model.source, dict(getattr(model, "overrides", None) or {})
    if is_run_dir(os.path.expanduser(source)):
        from tempax.algorithms.run_dirs import shape_source  # the training layer, for run dirs only

        source, overrides = shape_source(os.path.expanduser(source))
    try:
        cfg = inspect_model(source).config
        return cfg.replace(**overrides) if overrides else cfg
    except TempaxError as e:
        raise ConfigError(f"{section}.source: {e}") from None


def _abstract(cfg: ModelConfig, lora: Any, seed: int) -> nnx.Module:
    def build() -> nnx.Module:
        model = Decoder(cfg, rngs=nnx.Rngs(seed))
        return (apply_lora(model, lora, rngs=nnx.Rngs(seed + 1)) or model) if lora is not None else model

    return nnx.eval_shape(build)


def _bytes(state: Any) -> int:
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in _leaves(state))


def _leaves(state: Any) -> list[Any]:
    import jax

    return [x for x in jax.tree.leaves(state) if hasattr(x, "dtype") and not jax.dtypes.issubdtype(
        x.dtype, jax.dtypes.prng_key)]


def recipe_plan_inputs(cfg: Any, command: str, *, backend: str | None = None) -> mem.PlanInputs:
    """The plan inputs of recipe config `cfg` of `command` (see the module docstring)."""
    from tempax import ops  # deferred with JAX's backend: `backend` None is this machine's

    train = cfg.train
    section = trained_section(command)
    model_cfg = source_config(section, getattr(cfg, section))
    lora = getattr(cfg, "lora", None)
    model = _abstract(model_cfg, lora, train.seed)
    trainable_filter = nnx.LoRAParam if lora is not None else nnx.Param
    trainable = sum(math.prod(x.shape) for x in _leaves(nnx.state(model, trainable_filter)))
    rest = nnx.state(model, nnx.Not(trainable_filter))
    frozen = max(model_cfg.num_params() - trainable, 0)
    extra = 0
    for other in get(command).models:
        other_model = getattr(cfg, other, None)
        if other == section or other_model is None or other_model.source in get(command).models:
            continue  # the trained model, or a copy of another section's model
        held = source_config(other, other_model)
        extra += held.num_params() * (2 if held.param_dtype == "bfloat16" else 4)
    mesh = train.mesh
    axes = tuple((name, size) for name, size in (("fsdp", mesh.fsdp), ("tensor", mesh.tensor)) if size > 1)
    backend = backend or ops.backend()
    # A recipe whose loss computes the head in chunks (`loss.chunk_len`, with `loss.fused` where the loss has the
    # switch: SFT, distillation) holds logits for that many positions of a row at a time.
    loss = getattr(cfg, "loss", None)
    chunk = getattr(loss, "chunk_len", None) if getattr(loss, "fused", True) else None
    p = mem.train_plan_inputs(
        train, model_cfg, trainable_params=None if lora is None else trainable,
        frozen_bytes_per_param=_bytes(rest) / frozen if lora is not None and frozen else None,
        extra_frozen_bytes=extra, logit_positions=chunk, mesh_shape=axes, remat=train.remat,
        host_is_separate=backend != "cpu", backend=backend,
    )
    probe = mem.residual_probe(model, trainable_filter, seq_len=p.seq_len, precision=train.precision, backend=backend)
    return replace(p, probe=probe)


def recipe_memory(cfg: Any, command: str, capacity: int, *, backend: str | None = None) -> RecipeMemory:
    """The plan of recipe config `cfg` on a device of `capacity` bytes, with `train.memory` settled as a run
    settles it (and `train.auto_micro_batch` too), and the settings that would fit when it does not."""
    train = cfg.train
    p = recipe_plan_inputs(cfg, command, backend=backend)
    choice = mem.choose_memory(p, capacity, requested=train.memory)
    p = replace(p, memory=choice.setting)
    if train.auto_micro_batch:
        best = mem.largest_fitting_micro_batch(p, train.batch_size, capacity)
        if best is not None:
            p = replace(p, micro_batch_size=best, num_micro_batches=train.batch_size // best)
            choice = replace(choice, plan=mem.plan_memory(p, capacity))
    fixes = () if choice.plan.fits else tuple(mem.suggest_fixes(p, train.batch_size, capacity))
    return RecipeMemory(p, choice, fixes, capacity)
