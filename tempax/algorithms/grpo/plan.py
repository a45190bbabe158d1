"""What a GRPO run derives from its recipe, once: the plan `main` builds and passes down as values.

    plan = GRPOPlan.build(cfg.grpo, cfg.env, tokenizer)     # the environment built, the episode budget computed
    prompts, held_rows = task_prompts(run, tokenizer, ..., env_factory=plan.env_factory)
    source = GRPOSource(tokenizer, sampler, reward_fn, plan, prompt_len=prompt_len)
    trainable = grpo_trainable(policy, plan, prompt_len=prompt_len)    # a row: the prompt and G episodes

The batch source, the trainer's memory plan, the rollout workers and the held-out evaluation read these values;
none of them reads the recipe's `grpo:` or `env:` section again (the loss's own knobs are `make_grpo_loss`'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tempax.algorithms.grpo.config import GRPOKnobsConfig
from tempax.envs.registry import EnvFactory, EnvironmentConfig
from tempax.errors import ConfigError
from tempax.rl.rollout import Prompt, Rollout, sample_rollout


@dataclass(frozen=True)
class RolloutOptions:
    """What one round of GRPO sampling passes to `tempax.rl.rollout.sample_rollout` (its docstring says what each
    does); plain values, so a rollout worker receives them as they are."""

    group_size: int
    max_new_tokens: int
    episode_tokens: int  # T, the completion (episode) length of a batch row
    max_turns: int
    top_p: float
    advantage: str  # the estimator in effect (grpo with scale_rewards=false is dr_grpo)
    reward_combination: str
    overlong_penalty_tokens: int
    engine: str
    slots: int

    def sample(self, model: Any, tokenizer: Any, prompts: Sequence[Prompt], reward_fn: Any, *, temperature: float,
               seed: int, env_factory: EnvFactory | None = None) -> Rollout:
        """G completions (episodes, with `env_factory`) of each prompt, scored, with group advantages."""
        return sample_rollout(
            model, tokenizer, prompts, reward_fn, group_size=self.group_size, max_new_tokens=self.max_new_tokens,
            temperature=temperature, top_p=self.top_p, seed=seed, advantage=self.advantage,
            reward_combination=self.reward_combination,
            reward_weights=dict(zip(reward_fn.names, reward_fn.weights)) if reward_fn is not None else None,
            overlong_penalty_tokens=self.overlong_penalty_tokens, env_factory=env_factory, max_turns=self.max_turns,
            episode_tokens=self.episode_tokens, engine=self.engine, slots=self.slots,
        )


@dataclass(frozen=True)
class GRPOPlan:
    """The values of a GRPO run that its recipe settles before training (see the module docstring).

    Attributes:
      rollout: one sampling round's options.
      env_factory: the environment episodes play, built once (None: one reply to the prompt).
      passes: optimizer steps on each rollout (`grpo.num_iterations`).
      sampling_rounds: rollout rounds a step may draw (dynamic sampling's `max_sampling_rounds`; 1 without).
      dynamic_sampling: zero-spread groups are dropped and the batch filled from further rounds.
      beta: the KL weight; above 0 each batch carries the reference's log-probs.
      recompute_old_logprobs: with passes > 1, the old policy's log-probs come from a forward pass over the batch
        (`old_logprobs: recompute`), not from the sampler.
      workers, max_staleness: rollout workers on Ray and how many policy versions a rollout may lag.
      knobs: the starting values of what the collapse guard may change (temperature, eps_high, entropy_coef).
      show_completion_every: print the best completion every N steps (0: never).
    """

    rollout: RolloutOptions
    env_factory: EnvFactory | None
    passes: int
    sampling_rounds: int
    dynamic_sampling: bool
    beta: float
    recompute_old_logprobs: bool
    workers: int
    max_staleness: int
    knobs: Mapping[str, float]
    show_completion_every: int

    @classmethod
    def build(cls, settings: GRPOKnobsConfig, env: EnvironmentConfig = EnvironmentConfig(),
              tokenizer: Any = None) -> GRPOPlan:
        """The plan of `settings` playing `env` (the tokenizer builds a multi-turn environment; one-turn needs none).

        Raises:
          ConfigError: rollout workers with a multi-turn environment, or an episode budget under one turn.
        """
        if settings.workers > 0 and not env.single_turn:
            raise ConfigError("grpo.workers > 0 (rollout workers on Ray) plays one-turn tasks only; with an env: "
                              "block set grpo.workers=0")
        s = settings
        rollout = RolloutOptions(
            group_size=s.group_size, max_new_tokens=s.max_new_tokens,
            episode_tokens=env.episode_tokens(s.max_new_tokens, key="grpo.max_new_tokens"), max_turns=env.max_turns,
            top_p=s.top_p, advantage=s.estimator, reward_combination=s.reward_combination,
            overlong_penalty_tokens=s.overlong_penalty_tokens, engine=s.rollout_engine, slots=s.rollout_slots,
        )
        return cls(
            rollout=rollout, env_factory=None if env.single_turn else env.build(tokenizer),
            passes=s.num_iterations, sampling_rounds=s.max_sampling_rounds if s.dynamic_sampling else 1,
            dynamic_sampling=s.dynamic_sampling, beta=s.beta,
            recompute_old_logprobs=s.num_iterations > 1 and s.old_logprobs == "recompute",
            workers=s.workers, max_staleness=s.max_staleness,
            knobs={"temperature": s.temperature, "eps_high": s.eps_high, "entropy_coef": s.entropy_coef},
            show_completion_every=s.show_completion_every,
        )

    def tokens_per_row(self, prompt_len: int) -> int:
        """A training row's tokens for the memory plan: one prompt of `prompt_len` and its G episodes."""
        return int(prompt_len) + self.rollout.group_size * self.rollout.episode_tokens
