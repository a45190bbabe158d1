"""Typed configs of GRPO and its variants: the algorithm knobs, the task, the rewards and the evaluation.

A recipe is a `GRPOConfig`:

    model:   {source: smollm2-135m-instruct}
    lora:    {rank: 16, alpha: 32}              # null: full-weight training; quantize_base: nf4 for QLoRA
    task:    {name: gsm8k}
    rewards: {functions: [format, correctness]}
    grpo:    {group_size: 8, beta: 0.04, ...}
    eval:    {num_problems: 200}
    train:   {steps: 200, batch_size: 4, optimizer: {learning_rate: 5.0e-5}}

`GRPOConfig` says what the training loop's counts mean here; `GRPOKnobsConfig` lists the variants (GRPO,
Dr. GRPO, DAPO, GSPO) as settings of its fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tempax.algorithms.grpo.losses import AGGREGATION_MODES
from tempax.algorithms.common import ModelSourceConfig
from tempax.data.tasks.spec import TaskConfig
from tempax.envs.registry import EnvironmentConfig
from tempax.eval.spec import EvalConfig
from tempax.errors import ConfigError
from tempax.models.lora import LoraConfig
from tempax.rewards.registry import RewardsConfig
from tempax.rl.workers import RayConfig
from tempax.train.config import TrainConfig
from tempax.train.guards import CollapseGuardConfig
from tempax.configlib import help_field


@dataclass(frozen=True)
class GRPOKnobsConfig:
    """The algorithm: sampling, advantages, the clipped objective and the variants.

    The variants are settings of these fields (see `VARIANTS` for the exact values):

        GRPO      (Shao et al. 2024)   token ratio, seq_mean_token_mean, std-scaled advantages, beta > 0
        Dr. GRPO  (Liu et al. 2025)    seq_mean_token_sum_norm, scale_rewards: false (= advantage: dr_grpo)
        DAPO      (Yu et al. 2025)     token_mean, beta 0, epsilon_high 0.28 (clip-higher), dynamic_sampling,
                                       overlong_penalty_tokens > 0
        GSPO      (Zheng et al. 2025)  importance_sampling: sequence with epsilon 3e-4 / epsilon_high 4e-4

    Advantage estimators (`advantage`: grpo, dr_grpo, rloo, reinforce_pp) and the way several rewards combine
    (`reward_combination`: sum, normalize_each) are independent of the variant; see `advantages.py`.
    """

    group_size: int = help_field("Completions sampled per prompt (G); they share one prefill of the prompt.", 8)
    num_iterations: int = help_field(
        "Optimizer passes over each batch of rollouts (mu). 1 is on-policy (the ratio is exactly 1); more "
        "passes reuse the samples and make the clip matter.",
        1,
    )
    max_new_tokens: int = help_field("Most tokens per completion; longer ones are cut (and counted as truncated).", 256)
    max_prompt_len: int = help_field(
        "Prompts longer than this (in tokens, chat template included) are dropped from the task and counted.", 512
    )
    temperature: float = help_field(
        "Sampling temperature (> 0). Log-probs in the loss use the same temperature, so the policy being "
        "optimised is the one that sampled.",
        1.0,
    )
    top_p: float = help_field(
        "Nucleus sampling; 1.0 (off) keeps the sampler equal to the trained distribution. Anything else makes "
        "the rollouts slightly off-policy.",
        1.0,
    )
    beta: float = help_field(
        "Weight of the k3 KL penalty to the frozen reference. 0 skips the reference forward pass entirely. With "
        "LoRA the reference is the base model with the adapters switched off; with full-weight training a "
        "frozen copy of the starting weights.",
        0.04,
    )
    epsilon: float = help_field("Lower clip range: the ratio is clipped at 1 - epsilon.", 0.2)
    epsilon_high: float | None = help_field(
        "Upper clip range (1 + epsilon_high); null = epsilon. DAPO's clip-higher uses 0.28.", None
    )
    loss_aggregation: Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"] = help_field(
        "seq_mean_token_mean (GRPO: each completion weighs the same), token_mean (DAPO: each token weighs "
        "the same), seq_mean_token_sum_norm (Dr. GRPO: token sums over max_new_tokens, no length bias).",
        "seq_mean_token_mean",
    )
    importance_sampling: Literal["token", "sequence"] = help_field(
        "token: per-token ratio (GRPO/DAPO); sequence: GSPO's length-normalised sequence ratio.", "token"
    )
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"] = help_field(
        "Advantage estimator (tempax/rl/advantages.py): grpo ((r - group mean) / group std), dr_grpo "
        "(r - group mean), rloo (leave-one-out baseline: mean of the other samples), reinforce_pp (group-centred, "
        "scaled by one std over the batch). rloo / dr_grpo / reinforce_pp do not blow up groups whose rewards "
        "barely differ (noisy rubric or reward-model scores), which grpo's per-group std does.",
        "grpo",
    )
    scale_rewards: bool = help_field(
        "With advantage: grpo, divide group-centred rewards by the group std; false = Dr. GRPO (same as "
        "advantage: dr_grpo).",
        True,
    )
    reward_combination: Literal["sum", "normalize_each"] = help_field(
        "Several reward functions: sum (weighted sum, then the advantage estimator) or normalize_each (GDPO: the "
        "estimator on each reward within its group, then the weighted sum, normalised over the batch). Per-reward "
        "values are logged either way (reward/<name>).",
        "sum",
    )
    dynamic_sampling: bool = help_field(
        "DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts to fill the "
        "batch (up to max_sampling_rounds rollouts per step; a batch still short is filled with dropped groups, "
        "which carry zero advantage).",
        False,
    )
    max_sampling_rounds: int = help_field("Rollout rounds per step allowed by dynamic sampling.", 3)
    overlong_penalty_tokens: int = help_field(
        "DAPO soft overlong penalty: the last N tokens of the max_new_tokens budget ramp a penalty from 0 to -1 "
        "(added to the reward as `overlong`); 0 disables it.",
        0,
    )
    old_logprobs: Literal["sampling", "recompute"] = help_field(
        "Old-policy log-probs for num_iterations > 1: the sampler's (free; equal to the training forward up to "
        "float rounding when both run in the same precision) or a recomputed forward pass (use it when the "
        "sampler runs in a lower precision than training).",
        "sampling",
    )
    log_entropy: bool = help_field("Report the policy's token entropy (one extra softmax pass over the vocabulary).", True)
    entropy_coef: float = help_field(
        "Entropy bonus: the loss subtracts coef x the policy's token entropy (aggregated like the loss), which "
        "keeps the policy exploring; 0: off. The collapse guard's entropy_bonus action switches it on mid-run.",
        0.0,
    )
    rollout_engine: Literal["batch", "slots"] = help_field(
        "How rollouts decode. batch: all prompts x group_size completions as one batch, turn by turn; slots: on the "
        "continuously batched slot engine, where a finished completion frees its slot for the next group and a "
        "multi-turn episode goes on after its tool call without waiting for the other rows' turns. Each row draws "
        "its own random stream on both, so they give the same completions up to float rounding. Measured on the "
        "results page (docs/serving.md).",
        "batch",
    )
    rollout_slots: int = help_field(
        "With rollout_engine: slots, the rows decoded together (0: every completion of the rollout at once; "
        "otherwise at least group_size, and groups wait for free slots).",
        0,
    )
    show_completion_every: int = help_field("Print one sampled completion with its reward every N steps (0: never).", 0)
    workers: int = help_field(
        "Rollout workers (Ray actors, each a process with a policy copy and the generation engine) that sample "
        "while the trainer trains; 0 samples in the training process, one rollout after the other (the default). "
        "Needs `pip install 'tempax[distributed]'`; the `ray` section says where Ray runs.",
        0,
    )
    max_staleness: int = help_field(
        "With workers: the most policy versions (optimizer updates) a rollout may lag behind the trainer. 0 is "
        "the synchronous loop (each rollout sampled with the weights it is trained on, equal to workers: 0); k "
        "lets the workers sample up to k rollouts ahead, and corrects them with truncated importance weights.",
        0,
    )
    is_cap: float = help_field(
        "Truncation C of the importance weights min(pi / pi_sampler, C) of stale rollouts (max_staleness > 0).",
        2.0,
    )

    def validate(self) -> None:
        self._validate_workers()
        if self.group_size < 2:
            raise ConfigError(f"grpo.group_size must be >= 2 (advantages compare completions of a prompt), got "
                              f"{self.group_size}")
        if self.num_iterations < 1:
            raise ConfigError(f"grpo.num_iterations must be >= 1, got {self.num_iterations}")
        if self.rollout_slots and self.rollout_slots < self.group_size:
            raise ConfigError(f"grpo.rollout_slots={self.rollout_slots} is below grpo.group_size={self.group_size}: a "
                              "group's completions decode together (they share its prompt's prefill); set it to 0 "
                              f"(all at once) or at least {self.group_size}")
        if self.max_new_tokens < 1 or self.max_prompt_len < 1:
            raise ConfigError("grpo.max_new_tokens and grpo.max_prompt_len must be >= 1")
        if not self.temperature > 0:
            raise ConfigError(
                f"grpo.temperature must be > 0 (greedy rollouts give every completion of a group the same reward); "
                f"got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"grpo.top_p must be in (0, 1], got {self.top_p}")
        if self.beta < 0:
            raise ConfigError(f"grpo.beta must be >= 0, got {self.beta}")
        if self.epsilon <= 0 or (self.epsilon_high is not None and self.epsilon_high <= 0):
            raise ConfigError("grpo.epsilon and grpo.epsilon_high must be > 0")
        if not self.scale_rewards and self.advantage != "grpo":
            raise ConfigError(
                f"grpo.scale_rewards=false only modifies advantage: grpo (it is then dr_grpo); with "
                f"advantage: {self.advantage} leave it true"
            )
        if self.loss_aggregation not in AGGREGATION_MODES:
            raise ConfigError(f"grpo.loss_aggregation must be one of {AGGREGATION_MODES}")
        if self.entropy_coef < 0:
            raise ConfigError(f"grpo.entropy_coef must be >= 0, got {self.entropy_coef}")
        if self.max_sampling_rounds < 1:
            raise ConfigError(f"grpo.max_sampling_rounds must be >= 1, got {self.max_sampling_rounds}")
        if not 0 <= self.overlong_penalty_tokens <= self.max_new_tokens:
            raise ConfigError(
                f"grpo.overlong_penalty_tokens must be in [0, max_new_tokens={self.max_new_tokens}], got "
                f"{self.overlong_penalty_tokens}"
            )

    def _validate_workers(self) -> None:
        if self.workers < 0 or self.max_staleness < 0 or not self.is_cap > 0:
            raise ConfigError(f"grpo.workers and grpo.max_staleness must be >= 0 and grpo.is_cap > 0; got workers="
                              f"{self.workers}, max_staleness={self.max_staleness}, is_cap={self.is_cap}")
        if self.workers == 0:
            if self.max_staleness:
                raise ConfigError("grpo.max_staleness needs rollout workers: set grpo.workers >= 1 (or leave "
                                  "max_staleness at 0)")
            return
        if self.num_iterations != 1 or self.dynamic_sampling:
            raise ConfigError(
                "rollout workers (grpo.workers > 0) sample one rollout per optimizer update: set "
                "grpo.num_iterations=1 and grpo.dynamic_sampling=false, or grpo.workers=0"
            )
        if self.max_staleness > 0 and self.top_p < 1:
            raise ConfigError(
                f"grpo.max_staleness > 0 with grpo.top_p={self.top_p}: the sampler reports log-probs of the full "
                "softmax, not of the nucleus it drew from, so the importance weights would be biased "
                "(tempax/rl/staleness.py); set grpo.top_p=1.0 or grpo.max_staleness=0"
            )

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def estimator(self) -> str:
        """The `advantages.estimate_advantages` name in effect (grpo with scale_rewards=false is dr_grpo)."""
        return "dr_grpo" if self.advantage == "grpo" and not self.scale_rewards else self.advantage


# The published variants as overrides of `GRPOKnobsConfig` (the recipes spell them out).
VARIANTS: dict[str, dict[str, Any]] = {
    "grpo": dict(loss_aggregation="seq_mean_token_mean", importance_sampling="token", scale_rewards=True),
    "dr_grpo": dict(loss_aggregation="seq_mean_token_sum_norm", scale_rewards=False),
    "dapo": dict(loss_aggregation="token_mean", beta=0.0, epsilon=0.2, epsilon_high=0.28, dynamic_sampling=True,
                 overlong_penalty_tokens=64),
    "gspo": dict(importance_sampling="sequence", epsilon=3e-4, epsilon_high=4e-4, loss_aggregation="seq_mean_token_mean"),
}


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO (and Dr. GRPO, DAPO, GSPO) with verifiable rewards: full-weight, LoRA or QLoRA.

    `train.batch_size` counts *prompts* per optimizer step; each prompt brings `grpo.group_size` completions, so a
    step trains on batch_size x group_size completions (`train.micro_batch_size` also counts prompts). `train.steps`
    counts optimizer updates; with `grpo.num_iterations` = mu, every batch of rollouts is trained on mu times, so
    the run samples steps / mu rollout batches. `train.seq_len` is not used: GRPO's sequence shape comes from the
    prompts and `grpo.max_new_tokens`.
    """

    model: ModelSourceConfig = help_field("The policy's starting model.", default_factory=ModelSourceConfig)
    lora: LoraConfig | None = help_field(
        "LoRA/QLoRA adapters (the reference is then the base with adapters off); null: full-weight training.",
        default_factory=lambda: LoraConfig(rank=16, alpha=32.0),
    )
    task: TaskConfig = help_field("Prompts and reference answers.", default_factory=TaskConfig)
    rewards: RewardsConfig = help_field(
        "Reward functions on each episode's final reply (may be empty when the environment gives every reward).",
        default_factory=RewardsConfig)
    env: EnvironmentConfig = help_field(
        "The environment episodes play: single_turn (one reply to the prompt), calculator (tool calls), or a "
        "user environment FILE.py:Class; max_turns and the episode's token budget.",
        default_factory=EnvironmentConfig)
    grpo: GRPOKnobsConfig = help_field("The algorithm.", default_factory=GRPOKnobsConfig)
    eval: EvalConfig = help_field("Evaluation before and after training.", default_factory=EvalConfig)
    guard: CollapseGuardConfig = help_field(
        "Entropy-collapse guard (on, warn-only by default): thresholds on entropy, zero-spread groups, duplicate "
        "completions and completion length, and the action when one is crossed.",
        default_factory=CollapseGuardConfig,
    )
    ray: RayConfig = help_field(
        "Where Ray runs when grpo.workers > 0 (a local instance by default, or a cluster address).",
        default_factory=RayConfig,
    )
    train: TrainConfig = help_field(
        "The training loop. batch_size and micro_batch_size count prompts (x group_size completions each); "
        "steps counts optimizer updates. remat defaults to full (each layer's activations recomputed in the "
        "backward, as TRL's gradient_checkpointing=True): none is faster and keeps every layer's activations.",
        default_factory=lambda: TrainConfig(steps=100, batch_size=4, remat="full"),
    )

    def validate(self) -> None:
        if not self.rewards.functions and self.env.single_turn:
            raise ConfigError("rewards.functions is empty; name at least one, e.g. [format, correctness] (only a "
                              "run whose environment gives the rewards may leave it empty)")
        self.env.episode_tokens(self.grpo.max_new_tokens, key="grpo.max_new_tokens")  # a short budget, at parse time
        if self.lora is not None and self.lora.dropout > 0:
            raise ConfigError(
                "lora.dropout must be 0 for GRPO: dropout makes the training forward differ from the policy that "
                "sampled, so the importance ratio no longer starts at 1"
            )
