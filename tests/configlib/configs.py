"""Small config classes the tests of `tempax.configlib` build: a recipe with sections, an enum, a Literal, an
optional section, a fixed-length tuple, and one whose keys were renamed."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional

from tempax.errors import ConfigError


class Precision(enum.Enum):
    FP32 = "float32"
    BF16 = "bfloat16"


@dataclass(frozen=True)
class OptimizerConfig:
    learning_rate: float = field(default=3e-4, metadata={"help": "Peak learning rate."})
    warmup_steps: int = field(default=10, metadata={"help": "Linear warm-up length in steps."})
    total_steps: int = field(default=100, metadata={"help": "Length of the schedule."})
    name: Literal["adamw", "sgd"] = field(default="adamw", metadata={"help": "Update rule."})

    def validate(self) -> None:
        if self.warmup_steps > self.total_steps:
            raise ConfigError(f"warmup_steps ({self.warmup_steps}) must be <= total_steps ({self.total_steps})")


@dataclass(frozen=True)
class LoraConfig:
    rank: int = field(default=8, metadata={"help": "Adapter rank."})
    targets: tuple[str, ...] = field(default=("q_proj", "v_proj"), metadata={"help": "Modules to adapt."})


@dataclass(frozen=True)
class TrainConfig:
    model: str = field(metadata={"help": "Model id or path."})
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig, metadata={"help": "Optimizer."})
    lora: Optional[LoraConfig] = field(default=None, metadata={"help": "LoRA adapters; null trains all weights."})
    seed: int = field(default=0, metadata={"help": "Random seed."})
    packing: bool = field(default=False, metadata={"help": "Pack short rows together."})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "Clip threshold; null disables."})
    loss_weights: dict[str, float] = field(default_factory=dict, metadata={"help": "Per-source loss weights."})
    precision: Precision = field(default=Precision.FP32, metadata={"help": "Compute dtype."})
    run_name: str = field(default="run", metadata={"help": "Name of the output folder."})
    resume_from: Optional[str] = field(default=None, metadata={"help": "Checkpoint folder to resume from."})
    shape: tuple[int, int] = field(default=(1, 2), metadata={"help": "A fixed-length pair."})


@dataclass(frozen=True)
class PresetConfig:
    # The nested default differs from OptimizerConfig's own defaults.
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(learning_rate=1e-5, total_steps=7))


# A config whose keys were renamed: a field (samples -> group_size), a section (prompts -> data) after one of its
# keys moved into another section (prompts.num_eval -> eval.num_prompts), and a top-level key moved into a section
# (eval_before -> eval.before).
@dataclass(frozen=True)
class SamplingKnobsConfig:
    RENAMED_KEYS: ClassVar[Mapping[str, str]] = {"samples": "group_size"}

    group_size: int = field(default=1, metadata={"help": "Completions per prompt."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})


@dataclass(frozen=True)
class PromptDataConfig:
    path: str = field(default="train.jsonl", metadata={"help": "Training prompts."})
    eval_path: Optional[str] = field(default=None, metadata={"help": "Held-out prompts."})


@dataclass(frozen=True)
class HeldOutConfig:
    before: bool = field(default=True, metadata={"help": "Evaluate the starting model."})
    num_prompts: int = field(default=64, metadata={"help": "Held-out prompts to evaluate."})


@dataclass(frozen=True)
class RenamedConfig:
    RENAMED_KEYS: ClassVar[Mapping[str, str]] = {
        "prompts.num_eval": "eval.num_prompts", "prompts": "data", "eval_before": "eval.before"}

    data: PromptDataConfig = field(default_factory=PromptDataConfig, metadata={"help": "Prompts."})
    knobs: SamplingKnobsConfig = field(default_factory=SamplingKnobsConfig, metadata={"help": "Sampling."})
    eval: HeldOutConfig = field(default_factory=HeldOutConfig, metadata={"help": "Evaluation."})


OLD_RECIPE = {"prompts": {"path": "p.jsonl", "num_eval": 2}, "knobs": {"samples": 4}, "eval_before": False}
NEW_RECIPE = {"data": {"path": "p.jsonl"}, "knobs": {"group_size": 4}, "eval": {"num_prompts": 2, "before": False}}
