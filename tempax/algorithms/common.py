"""What every algorithm's config shares: the model to train (`ModelSourceConfig`) and building it with its adapters.

SFT, DPO, reward models and GRPO all name their model the same way (`model.source`, `model.tokenizer`) and
apply LoRA/QLoRA the same way (`lora:`), so the code lives here rather than in one algorithm's module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flax import nnx

from tempax.configlib import help_field
from tempax.errors import ConfigError
from tempax.models import registry
from tempax.models.lora import apply_lora, lora_filter
from tempax.algorithms.run_dirs import load_source


@dataclass(frozen=True)
class ModelSourceConfig:
    """Which model to train and its tokenizer."""

    source: str = help_field(
        "Registered name (smollm2-135m-instruct), preset:<name> (random init), a .gguf file, a Hugging Face "
        "folder, a Hub repo id, or a training run's directory (its newest intact checkpoint, adapters merged).",
        "smollm2-135m-instruct",
    )
    tokenizer: str | None = help_field(
        "Tokenizer source (same kinds as `source`); null: the model's own. Required for preset: sources.", None
    )
    overrides: dict[str, Any] = help_field(
        "ModelConfig fields to change on a preset: source (e.g. {vocab_size: 49152}).", default_factory=dict
    )

    def validate(self) -> None:
        if self.overrides and not self.source.startswith("preset:"):
            raise ConfigError("model.overrides only applies to preset:<name> sources (random initialisation)")

    def build(self, *, seed: int = 0, mesh: Any = None) -> tuple[nnx.Module, Any]:
        """(model, tokenizer). Presets are initialised by compiled per-part programs (compile time independent of
        depth, `tempax.models.init`), sharded over `mesh` when given; a training run's directory gives the model it
        trained, adapters merged (`tempax.algorithms.run_dirs`)."""
        if self.source.startswith(registry.PRESET_PREFIX) and not self.tokenizer:
            raise ConfigError(
                f"model.source={self.source} is a random-init shape without a tokenizer; set model.tokenizer, "
                "e.g. model.tokenizer=smollm2-135m-instruct"
            )
        return load_source(self.source, tokenizer=self.tokenizer, overrides=self.overrides or None, seed=seed,
                           mesh=mesh)


def base_model(cfg: Any, mesh: Any = None, *, model: nnx.Module | None = None, tokenizer: Any = None) -> tuple[nnx.Module, Any]:
    """(model, tokenizer) of an algorithm config with `model: ModelSourceConfig`, before any adapters: the `model` /
    `tokenizer` given (already built, e.g. the demo's), or built from `cfg.model` on `mesh`."""
    if model is None:
        model, built_tokenizer = cfg.model.build(seed=cfg.train.seed, mesh=mesh)
        tokenizer = tokenizer or built_tokenizer
    if tokenizer is None:
        raise ConfigError(f"model.source={cfg.model.source} has no tokenizer; set model.tokenizer")
    return model, tokenizer


def build_model(
    cfg: Any, mesh: Any = None, *, model: nnx.Module | None = None, tokenizer: Any = None
) -> tuple[nnx.Module, Any, Any]:
    """(model, tokenizer, trainable filter) of an algorithm config with `model: ModelSourceConfig`, `lora: LoraConfig |
    None` and `train: TrainConfig`: `base_model`, then LoRA/QLoRA applied when configured (adapters initialised
    from seed train.seed + 1)."""
    model, tokenizer = base_model(cfg, mesh, model=model, tokenizer=tokenizer)
    trainable: Any = nnx.Param
    if cfg.lora is not None:
        model = apply_lora(model, cfg.lora, rngs=nnx.Rngs(cfg.train.seed + 1)) or model
        trainable = lora_filter
    return model, tokenizer, trainable
