"""The generation-based evaluation of a verifiable-reward run (`EvalConfig`) and its `EvalOptions` (`eval_options`):
shared by the algorithms that evaluate answers to held-out problems (GRPO, RFT) and by the demo."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tempax.configlib import help_field
from tempax.errors import ConfigError


@dataclass(frozen=True)
class EvalConfig:
    """Generation-based evaluation on the held-out split, before and after training."""

    RENAMED_KEYS: ClassVar[Mapping[str, str]] = {"num_samples": "group_size"}

    num_problems: int = help_field("Held-out problems to evaluate (0: no evaluation).", 200)
    before: bool = help_field("Evaluate the starting model.", True)
    after: bool = help_field("Evaluate the trained model.", True)
    max_new_tokens: int | None = help_field("Generation budget; null: grpo.max_new_tokens.", None)
    greedy: bool = help_field("Greedy decoding: answer and format accuracy of the most likely completion.", True)
    group_size: int = help_field(
        "Sampled completions per problem for pass@k (0: none); `tempax eval --samples` sets the same.", 0)
    temperature: float = help_field("Temperature of the sampled completions.", 1.0)
    ks: tuple[int, ...] = help_field("k values of pass@k (each <= group_size).", (1,))
    batch_size: int = help_field("Prompts per generation call.", 64)

    def validate(self) -> None:
        if self.num_problems < 0 or self.group_size < 0:
            raise ConfigError("eval.num_problems and eval.group_size must be >= 0")
        if self.group_size and any(k < 1 or k > self.group_size for k in self.ks):
            raise ConfigError(f"eval.ks={self.ks} must lie in 1..group_size={self.group_size}")
        if self.batch_size < 1:
            raise ConfigError(f"eval.batch_size must be >= 1, got {self.batch_size}")


def eval_options(spec: EvalConfig, default_max_new_tokens: int, seed: int = 0) -> Any:
    """The `EvalOptions` of a spec (`max_new_tokens` null: the run's sampling budget)."""
    from tempax.eval.evaluate import EvalOptions  # imports the generator and JAX: configs stay light to parse

    return EvalOptions(
        max_new_tokens=spec.max_new_tokens or default_max_new_tokens, greedy=spec.greedy,
        group_size=spec.group_size, temperature=spec.temperature, ks=spec.ks if spec.group_size else (1,),
        batch_size=spec.batch_size, seed=seed,
    )
