"""Typed config of RLHF with PPO: the policy, the reward model, the prompts, the algorithm and the evaluation.

A recipe is a `PPOConfig`:

    model:        {source: smollm2-135m-instruct}
    lora:         {rank: 16, alpha: 32}              # null: full-weight training
    reward_model: runs/reward_model_smollm2_lora     # a `tempax reward-model` run dir (or its reward_model/)
    data:         {path: pairs/train.jsonl.gz, eval_path: pairs/test.jsonl.gz}   # HH-RLHF dialogues
    ppo:          {value: head, kl_coef: 0.05, gamma: 1.0, lam: 0.95, epochs: 2, mini_batches: 2, ...}
    eval:         {num_prompts: 64, before: true, after: true}
    train:        {steps: 24, batch_size: 8, optimizer: {learning_rate: 1.0e-4}}

Counting: `train.batch_size` is prompts per optimizer step (a mini-batch; each prompt brings
`ppo.group_size` completions), `train.steps` counts optimizer updates. Each rollout samples
`batch_size x mini_batches` prompts and is trained on for `epochs` passes of `mini_batches` mini-batches, so the
run samples steps / (epochs x mini_batches) rollouts. `train.seq_len` is not used: the row shape comes from the
prompts and `ppo.max_new_tokens`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from tempax.algorithms.common import ModelSourceConfig
from tempax.configlib import help_field
from tempax.errors import ConfigError
from tempax.models.lora import LoraConfig
from tempax.train.config import TrainConfig
from tempax.train.guards import CollapseGuardConfig


@dataclass(frozen=True)
class PPOKnobsConfig:
    """The algorithm: sampling, reward shaping, GAE, the clipped losses and the value function."""

    RENAMED_KEYS: ClassVar[Mapping[str, str]] = {"samples_per_prompt": "group_size"}

    value: Literal["head", "critic"] = help_field(
        "head: a scalar value head on the policy's own trunk (one forward pass gives log-probs and values; "
        "cheapest). critic: a separate decoder initialised from the reward model's folder (backbone and score "
        "head), trained beside the policy (LoRA too when lora is set); twice the forward/backward work.",
        "head",
    )
    group_size: int = help_field("Completions sampled per prompt (G); they share one prefill.", 1)
    max_new_tokens: int = help_field("Most tokens per completion.", 64)
    max_prompt_len: int = help_field("Prompts longer than this (tokens, chat template included) are dropped.", 256)
    temperature: float = help_field("Sampling temperature (> 0); log-probs in the loss use the same one.", 1.0)
    top_p: float = help_field("Nucleus sampling; 1.0 keeps the sampler equal to the trained distribution.", 1.0)
    kl_coef: float = help_field("beta: the per-token k1 KL penalty log pi - log ref folded into the rewards.", 0.05)
    kl_target: float | None = help_field(
        "Adaptive KL (Ziegler et al. 2019): target KL in nats per completion; null keeps kl_coef fixed.", None
    )
    kl_horizon: float = help_field("Adaptive KL horizon, in completions.", 10_000.0)
    missing_eos_penalty: float = help_field(
        "Subtracted from the score of completions cut at max_new_tokens without a stop token (0: off).", 0.0
    )
    gamma: float = help_field("GAE discount over completion tokens.", 1.0)
    lam: float = help_field("GAE lambda.", 0.95)
    whiten_advantages: bool = help_field("Whiten advantages over the rollout's valid tokens.", True)
    clip_range: float = help_field("eps: the policy ratio is clipped to [1 - eps, 1 + eps].", 0.2)
    value_clip_range: float = help_field("c: values may move at most c from their rollout-time values per update.", 0.2)
    vf_coef: float = help_field("Weight of the value loss in the total loss.", 0.1)
    epochs: int = help_field("Passes over each rollout (PPO epochs).", 2)
    mini_batches: int = help_field("Mini-batches (optimizer steps) per pass; the rollout has batch_size x this prompts.",
                              2)
    log_entropy: bool = help_field("Report the policy's token entropy (one extra softmax pass).", True)
    reward_functions: tuple[str, ...] = help_field(
        "Extra reward functions added to the reward model's score (names as in GRPO's rewards.functions: "
        "format, correctness, length, or package.module:function).",
        (),
    )
    reward_batch_size: int = help_field("Rows per reward-model forward pass.", 8)

    def validate(self) -> None:
        if self.group_size < 1 or self.epochs < 1 or self.mini_batches < 1:
            raise ConfigError("ppo.group_size, ppo.epochs and ppo.mini_batches must be >= 1")
        if self.max_new_tokens < 1 or self.max_prompt_len < 1:
            raise ConfigError("ppo.max_new_tokens and ppo.max_prompt_len must be >= 1")
        if not self.temperature > 0:
            raise ConfigError(f"ppo.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"ppo.top_p must be in (0, 1], got {self.top_p}")
        if self.kl_coef < 0 or self.missing_eos_penalty < 0 or self.vf_coef < 0:
            raise ConfigError("ppo.kl_coef, ppo.missing_eos_penalty and ppo.vf_coef must be >= 0")
        if self.kl_target is not None and (self.kl_target <= 0 or self.kl_horizon <= 0 or self.kl_coef <= 0):
            raise ConfigError("adaptive KL needs ppo.kl_target > 0, ppo.kl_horizon > 0 and ppo.kl_coef > 0")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ConfigError(f"ppo.gamma and ppo.lam must lie in [0, 1], got {self.gamma}, {self.lam}")
        if self.clip_range <= 0 or self.value_clip_range <= 0:
            raise ConfigError("ppo.clip_range and ppo.value_clip_range must be > 0")
        if self.reward_batch_size < 1:
            raise ConfigError(f"ppo.reward_batch_size must be >= 1, got {self.reward_batch_size}")


@dataclass(frozen=True)
class PromptDataConfig:
    """Where the prompts come from: the shared prompt of preference pairs (HH-RLHF dialogues) or chat rows."""

    path: str | None = help_field(
        "Training prompts (required): preference pairs (HH-RLHF dialogues, {prompt, chosen, rejected}) or rows "
        "with `prompt_messages`; .jsonl/.json/.parquet (gzip ok), a folder or a Hub id (its train split).",
        None,
    )
    eval_path: str | None = help_field("Held-out prompts (same kinds); null: no evaluation.", None)
    max_rows: int | None = help_field("Use only the first N training rows; null: all.", None)

    def validate(self) -> None:
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"data.max_rows must be >= 1 or null, got {self.max_rows}")


@dataclass(frozen=True)
class PPOEvalConfig:
    """Held-out evaluation: one sampled response per prompt, scored by the reward model, KL to the reference."""

    num_prompts: int = help_field(
        "Held-out prompts to evaluate before and after: the first N of data.eval_path that fit ppo.max_prompt_len "
        "(0: none). They count in the prompt length rollout rows are padded to, so they are read even with before "
        "and after off.", 64)
    before: bool = help_field("Evaluate the starting policy.", True)
    after: bool = help_field("Evaluate the trained policy.", True)
    temperature: float = help_field(
        "Sampling temperature (> 0) of the evaluated responses; the KL to the reference is measured on them, "
        "which greedy responses would not allow.",
        1.0,
    )
    batch_size: int = help_field("Prompts per generation call.", 32)
    show: int = help_field("Before/after responses printed side by side (and written to eval.json).", 3)
    seed: int = help_field("Sampling seed (the same for before and after).", 1234)

    def validate(self) -> None:
        if self.num_prompts < 0:
            raise ConfigError(f"eval.num_prompts must be >= 0, got {self.num_prompts}")
        if not self.temperature > 0:
            raise ConfigError(f"eval.temperature must be > 0, got {self.temperature}")
        if self.batch_size < 1 or self.show < 0:
            raise ConfigError("eval.batch_size must be >= 1 and eval.show >= 0")


@dataclass(frozen=True)
class PPOConfig:
    """RLHF with PPO: a policy (full, LoRA or QLoRA) and a value function against a trained reward model."""

    RENAMED_KEYS: ClassVar[Mapping[str, str]] = {"prompts.num_eval": "eval.num_prompts", "prompts": "data"}
    # The held-out prompts size the rollout rows (the prompt length covers them), so for PPO these keys change
    # the trajectory, though tempax.train.run_identity takes held-out keys as bookkeeping for other commands.
    TRAJECTORY_KEYS: ClassVar[tuple[str, ...]] = ("data.eval_path", "eval.num_prompts")

    model: ModelSourceConfig = help_field("The policy's starting model (also the reference).",
                                          default_factory=ModelSourceConfig)
    lora: LoraConfig | None = help_field(
        "LoRA/QLoRA adapters (the reference is then the base with adapters off); null: full-weight training.",
        default_factory=lambda: LoraConfig(rank=16, alpha=32.0),
    )
    reward_model: str = help_field(
        "The reward model: a `tempax reward-model` run dir or the reward_model folder inside it.",
        "runs/reward_model_smollm2_lora",
    )
    data: PromptDataConfig = help_field("Training and held-out prompts.", default_factory=PromptDataConfig)
    ppo: PPOKnobsConfig = help_field("The algorithm.", default_factory=PPOKnobsConfig)
    eval: PPOEvalConfig = help_field("Held-out evaluation before and after.", default_factory=PPOEvalConfig)
    guard: CollapseGuardConfig = help_field(
        "Entropy-collapse guard (tempax.train.guards): watches the policy's entropy and the completion length; "
        "PPO supports action warn (default) or stop.",
        default_factory=CollapseGuardConfig,
    )
    train: TrainConfig = help_field(
        "The training loop. batch_size and micro_batch_size count prompts per optimizer step (a mini-batch); "
        "steps counts optimizer updates. remat defaults to full (each layer's activations recomputed in the "
        "backward, as TRL's gradient_checkpointing=True): none is faster and keeps every layer's activations.",
        default_factory=lambda: TrainConfig(steps=24, batch_size=8, remat="full"),
    )

    def validate(self) -> None:
        if self.lora is not None and self.lora.dropout > 0:
            raise ConfigError("lora.dropout must be 0 for PPO: the ratio pi / pi_old must start at 1")
        if self.guard.enabled and self.guard.action not in ("warn", "stop"):
            raise ConfigError(f"guard.action={self.guard.action} is not available for PPO; use warn or stop (and "
                              "ppo.kl_coef / ppo.temperature to keep the policy exploring)")
