"""Typed config of rejection-sampling fine-tuning (RFT / STaR / ReST-EM / expert iteration).

A recipe is an `RFTConfig`:

    command: rft
    model:   {source: smollm2-135m-instruct}
    lora:    {rank: 16, alpha: 32}
    task:    {name: arithmetic}
    rewards: {functions: [format, correctness]}     # the checker
    rft:     {group_size: 8, problems_per_round: 16, threshold: 2.0, max_per_problem: 4}
    eval:    {num_problems: 200}
    train:   {steps: 60, batch_size: 4, seq_len: 256, optimizer: {learning_rate: 5.0e-4}}

`train.steps` counts optimizer updates over the whole run; a round lasts as many steps as its kept completions
fill (`rft.epochs_per_round` passes over them, packed into `train.batch_size` rows of `train.seq_len` tokens), so
the number of rounds follows from how much each round keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from tempax.algorithms.common import ModelSourceConfig
from tempax.algorithms.rft.selection import WEIGHTINGS
from tempax.configlib import help_field
from tempax.data.tasks.spec import TaskConfig
from tempax.envs.registry import EnvironmentConfig
from tempax.errors import ConfigError
from tempax.eval.spec import EvalConfig
from tempax.models.lora import LoraConfig
from tempax.rewards.registry import RewardsConfig
from tempax.train.config import TrainConfig


@dataclass(frozen=True)
class RFTKnobsConfig:
    """The algorithm: how a round samples, which completions it keeps, and how long it trains on them."""

    RENAMED_KEYS: ClassVar[Mapping[str, str]] = {"samples_per_problem": "group_size"}

    group_size: int = help_field(
        "Completions sampled per problem (k); they share one prefill of the prompt.", 8)
    problems_per_round: int = help_field("Problems sampled per round (each k times).", 16)
    sampling_batch: int = help_field(
        "Problems per generation call (x group_size sequences decoded together); bounds the KV cache.", 8)
    max_new_tokens: int = help_field("Most tokens per completion; a completion cut here is never kept.", 256)
    max_prompt_len: int = help_field(
        "Prompts longer than this (in tokens, chat template included) are dropped from the task and counted.", 512)
    temperature: float = help_field("Sampling temperature (> 0).", 1.0)
    top_p: float = help_field("Nucleus sampling (1.0: off).", 1.0)
    threshold: float = help_field(
        "The checker: a completion is accepted when its total reward is at least this. With the default rewards "
        "(format + correctness) 2.0 means strict format and the right answer.", 2.0)
    keep_truncated: bool = help_field(
        "Also keep accepted completions that the token budget cut before their stop token (for answers without "
        "a stop token); false: never, since training on them teaches the policy not to stop.", False)
    max_per_problem: int = help_field(
        "Keep at most this many distinct accepted completions per problem, highest reward first (0: no cap).", 4)
    weighting: Literal["uniform", "per_problem"] = help_field(
        "Loss weight of a kept completion: uniform (each counts the same) or per_problem (each problem with a kept "
        "completion counts the same: 1 / kept).", "uniform")
    epochs_per_round: int = help_field("Passes over a round's kept completions before the next round samples.", 1)
    max_empty_rounds: int = help_field(
        "Stop with an error after this many rounds in a row keep nothing (the checker accepts nothing the policy "
        "samples).", 5)

    def validate(self) -> None:
        for name in ("group_size", "problems_per_round", "sampling_batch", "max_new_tokens",
                     "max_prompt_len", "epochs_per_round", "max_empty_rounds"):
            if getattr(self, name) < 1:
                raise ConfigError(f"rft.{name} must be >= 1, got {getattr(self, name)}")
        if not self.temperature > 0:
            raise ConfigError(f"rft.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rft.top_p must be in (0, 1], got {self.top_p}")
        if self.max_per_problem < 0:
            raise ConfigError(f"rft.max_per_problem must be >= 0 (0: no cap), got {self.max_per_problem}")
        if self.weighting not in WEIGHTINGS:
            raise ConfigError(f"rft.weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")


@dataclass(frozen=True)
class RFTConfig:
    """Rejection-sampling fine-tuning with a checker: sample, keep what passes, SFT on it, repeat."""

    model: ModelSourceConfig = help_field("The policy's starting model.", default_factory=ModelSourceConfig)
    lora: LoraConfig | None = help_field(
        "LoRA/QLoRA adapters; null: full-weight training.", default_factory=lambda: LoraConfig(rank=16, alpha=32.0))
    task: TaskConfig = help_field("Problems and reference answers.", default_factory=TaskConfig)
    rewards: RewardsConfig = help_field("The checker's reward functions (summed with weights).",
                                        default_factory=RewardsConfig)
    env: EnvironmentConfig = help_field(
        "The environment samples are episodes of (single_turn: one reply; calculator; a user FILE.py:Class); a "
        "kept episode is trained on the policy's replies only.", default_factory=EnvironmentConfig)
    rft: RFTKnobsConfig = help_field("The algorithm.", default_factory=RFTKnobsConfig)
    eval: EvalConfig = help_field("Evaluation before and after training.", default_factory=EvalConfig)
    train: TrainConfig = help_field(
        "The training loop: batch_size packed rows of seq_len tokens a step; steps counts optimizer updates over "
        "all rounds.", default_factory=lambda: TrainConfig(steps=100, batch_size=4, seq_len=256))

