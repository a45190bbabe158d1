"""`tempax ppo --config RECIPE.yaml`: RLHF with PPO against a trained reward model, from a `PPOConfig`.

    cfg = load_config(PPOConfig, "recipes/ppo_hh_smollm2_lora.yaml", ["train.steps=8"])
    run = main(cfg)

`main` builds the policy (LoRA/QLoRA when configured) and its value function (`ppo.value`: a head on the policy's
trunk, or a critic initialised from the reward model), the reward (the reward model's score plus
`ppo.reward_functions`), the prompts, the batch source (`PPORollouts`) and the `Trainer`; evaluates the policy on
held-out prompts before and after (`evaluate_policy`: the reward model's mean score of sampled responses and
their KL to the reference); trains with `Trainer.fit` (with the collapse guard and the time split as hooks); and writes
config.yaml, metrics.jsonl (the loss's metrics every step, the rollout's metrics on the step that trains on its
first mini-batch), eval.json, eval_responses.jsonl (each evaluated response as a {prompt, response} row that
`tempax score` reads), checkpoints and the adapters (PEFT layout) into `train.run_dir`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx

from tempax.algorithms.common import build_model
from tempax.algorithms.ppo.config import PPOConfig, PPOEvalConfig
from tempax.algorithms.ppo.model import ActorCritic, critic_from_reward_model, trainable_filter
from tempax.algorithms.ppo.source import PPORollouts, make_ppo_loss
from tempax.algorithms.run import RunResult, make_trainer, start_run
from tempax.data.formats import RowError
from tempax.data.preference import parse_preference_row
from tempax.data.sources import read_rows
from tempax.errors import ConfigError, DataError
from tempax.models.lora import apply_lora
from tempax.models.reward_model import is_reward_model_folder
from tempax.parallel.process import is_writer
from tempax.rewards.registry import REWARD_MODEL_PREFIX, RewardsConfig, build_rewards
from tempax.rl.rollout import Prompt, PromptSampler, build_batch, encode_prompts, round_up
from tempax.rl.throughput import ThroughputSplit
from tempax.train.guards import CollapseGuard, CollapseGuardConfig
from tempax.train.trainable import Trainable

__all__ = ["PPOConfig", "PolicyEval", "RunResult", "build_reward", "evaluate_policy", "load_prompts", "main"]


def reward_model_folder(path: str) -> str:
    """The reward-model folder of `path`: the folder itself, or `<run_dir>/reward_model`.

    Raises:
      ConfigError: neither holds a saved reward model.
    """

    for candidate in (path, os.path.join(path, "reward_model")):
        if is_reward_model_folder(candidate):
            return candidate
    raise ConfigError(
        f"reward_model={path!r} holds no saved reward model (no reward_model.json there or in its reward_model/); "
        "train one with `tempax reward-model --config recipes/reward_model_smollm2_lora.yaml` and pass its run dir"
    )


def build_reward(cfg: PPOConfig) -> Any:
    """The `CombinedReward`: the reward model's score (`reward_model`) plus `ppo.reward_functions`."""

    folder = reward_model_folder(cfg.reward_model)
    spec = RewardsConfig(functions=(REWARD_MODEL_PREFIX + folder, *cfg.ppo.reward_functions))
    return build_rewards(spec)


def load_prompts(path: str, tokenizer: Any, *, max_prompt_len: int, limit: int | None = None) -> tuple[list[Prompt], int]:
    """Chat prompts from a dataset: rows with `prompt_messages`, or the shared prompt of preference pairs
    (HH-RLHF dialogues, {prompt, chosen, rejected}). Returns (prompts, rows dropped: malformed or longer than
    `max_prompt_len` tokens). `limit` caps the prompts kept.

    Raises:
      DataError: no prompt is left.
    """

    rows, dropped = [], 0
    for row in read_rows(path):
        if row.data is None:
            dropped += 1
            continue
        try:
            messages = row.data.get("prompt_messages") or parse_preference_row(row.data).prompt
        except RowError:
            dropped += 1
            continue
        rows.append({"prompt_messages": messages})
    prompts, too_long = encode_prompts(tokenizer, rows, max_prompt_len=max_prompt_len)
    if limit is not None:
        prompts = prompts[:limit]
    if not prompts:
        raise DataError(f"{path}: no prompts left ({dropped} malformed rows, {too_long} longer than "
                        f"ppo.max_prompt_len={max_prompt_len} tokens)")
    return prompts, dropped + too_long


# ------------------------------------------------------------------------------------------------- evaluation


@dataclass
class PolicyEval:
    """One held-out evaluation: a sampled response per prompt, its reward-model score and KL to the reference.

    Attributes:
      scores: [N] reward-model scores.
      kl: [N] sequence KL estimates sum_t (log pi - log ref) of each response (at the sampling temperature).
      lengths: [N] response lengths in tokens.
      truncated: [N] responses cut at the budget.
      texts: the N responses.
    """

    scores: np.ndarray
    kl: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    texts: list[str]

    def summary(self) -> dict[str, float]:
        n = len(self.scores)
        return {
            "score_mean": float(self.scores.mean()), "score_sem": float(self.scores.std(ddof=1) / np.sqrt(n)) if n > 1
            else 0.0, "kl_mean": float(self.kl.mean()), "length_mean": float(self.lengths.mean()),
            "truncated_frac": float(self.truncated.mean()), "num_prompts": float(n),
        }


def evaluate_policy(source: PPORollouts, prompts: Sequence[Prompt], spec: PPOEvalConfig) -> PolicyEval:
    """One sampled response per prompt from the source's current policy (seeded, so before/after runs draw the
    same random streams), scored by the reward functions; KL to the reference from the source's no-grad passes."""
    scores, kls, lengths, truncated, texts = [], [], [], [], []
    for start in range(0, len(prompts), spec.batch_size):
        chunk = list(prompts[start:start + spec.batch_size])
        rollout = source.sample(chunk, seed=spec.seed + start, temperature=spec.temperature)
        batch = build_batch(rollout, prompt_len=source.prompt_len, pad_id=source.tokenizer.pad_id,
                            with_old_logp=False)
        logp, _ = source.forward(batch)
        ref = source.reference_logprobs(batch)
        mask = rollout.completion_mask.astype(bool)
        kls.append(np.where(mask, logp - ref, 0.0).sum(-1)[:, 0])
        scores.append(rollout.reward_parts["reward_model"][:, 0])
        lengths.append(rollout.lengths[:, 0])
        truncated.append(rollout.truncated[:, 0])
        texts.extend(group[0] for group in rollout.texts)
    cat = np.concatenate
    return PolicyEval(cat(scores), cat(kls), cat(lengths), cat(truncated), texts)


def _compare(before: PolicyEval, after: PolicyEval) -> dict[str, float]:
    diff = after.scores - before.scores
    n = len(diff)
    return {"score_gain": float(diff.mean()),
            "score_gain_sem": float(diff.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
            "after_better_frac": float((diff > 0).mean())}


def format_eval(before: PolicyEval | None, after: PolicyEval | None) -> str:
    rows = [(name, e.summary()) for name, e in (("before", before), ("after", after)) if e is not None]
    lines = [f"{'stage':<8} {'RM score':>16} {'KL to ref':>10} {'length':>7} {'no EOS':>7}"]
    for name, s in rows:
        lines.append(f"{name:<8} {s['score_mean']:>9.3f} +- {s['score_sem']:.3f} {s['kl_mean']:>10.3f} "
                     f"{s['length_mean']:>7.1f} {s['truncated_frac']:>7.2f}")
    if before is not None and after is not None:
        c = _compare(before, after)
        lines.append(f"paired gain {c['score_gain']:+.3f} +- {c['score_gain_sem']:.3f} (s.e.), after better on "
                     f"{c['after_better_frac']:.0%} of prompts")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ main


def _nbytes(tree: Any) -> int:
    return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(tree))


def build_actor_critic(cfg: PPOConfig, mesh: Any = None) -> tuple[ActorCritic, Any, Any]:
    """(ActorCritic, tokenizer, trainable filter): the policy with LoRA when configured, and its value function."""
    policy, tokenizer, _ = build_model(cfg, mesh)
    critic = head = None
    if cfg.ppo.value == "critic":
        critic, head = critic_from_reward_model(reward_model_folder(cfg.reward_model))
        if cfg.lora is not None:

            critic = apply_lora(critic, cfg.lora, rngs=nnx.Rngs(cfg.train.seed + 3)) or critic
    model = ActorCritic(policy, rngs=nnx.Rngs(cfg.train.seed + 2), critic=critic, value_head=head)
    return model, tokenizer, trainable_filter(cfg.lora is not None)


def ppo_hooks(source: PPORollouts, guard: CollapseGuardConfig) -> list[Any]:
    """The hooks every PPO run gets: the time split of each step and the collapse guard (warn or stop)."""

    hooks: list[Any] = [ThroughputSplit()]
    if guard.enabled:
        hooks.append(CollapseGuard(guard, advice=source.advice))
    return hooks


def main(cfg: PPOConfig, *, hooks: tuple = (), log: Callable[[str], None] | None = None) -> RunResult:
    """Trains per `cfg` (see the module docstring). The result's `source` is the `PPORollouts` (its `.history`
    holds the rollout metrics), `model` the `ActorCritic`, `before` / `after` the held-out `PolicyEval`s."""
    t, s = cfg.train, cfg.ppo
    run = start_run(cfg, log=log)
    say = run.say
    reward_fn = build_reward(cfg)
    model, tokenizer, trainable = build_actor_critic(cfg, run.mesh)
    prompts, dropped = load_prompts(cfg.data.path, tokenizer, max_prompt_len=s.max_prompt_len,
                                    limit=cfg.data.max_rows)
    held: list[Prompt] = []
    if cfg.data.eval_path and cfg.eval.num_prompts:
        held, _ = load_prompts(cfg.data.eval_path, tokenizer, max_prompt_len=s.max_prompt_len,
                               limit=cfg.eval.num_prompts)
    say(f"prompts: {len(prompts)} for training ({dropped} rows dropped: malformed or longer than "
        f"ppo.max_prompt_len={s.max_prompt_len}), {len(held)} held out")
    prompt_len = min(round_up(max(len(p.ids) for p in prompts + held), 8), round_up(s.max_prompt_len, 8))
    # Full weights: the source keeps a frozen copy of the starting policy (the trainer donates its buffers).
    source = PPORollouts(tokenizer, reward_fn, s, PromptSampler(prompts, seed=t.seed), prompt_len=prompt_len,
                         batch_size=t.batch_size, seed=t.seed, reference=model.policy if cfg.lora is None else None,
                         log=say)
    held_bytes = reward_fn.functions[0].fn.nbytes + (_nbytes(source.reference[1]) if source.reference else 0)
    # A row holds the prompt once plus its completions.
    tokens_per_row = prompt_len + s.group_size * s.max_new_tokens
    trainer = make_trainer(cfg, Trainable(model, tokens_per_row=tokens_per_row, held_bytes=held_bytes),
                           make_ppo_loss(s), algorithm="PPO", trainable=trainable, mesh=run.mesh, log=say)
    del model  # the trainer holds the weights now
    source.attach(trainer)  # before `fit` (which attaches it too): the evaluation samples from its weights
    before = None
    if held and cfg.eval.before:
        before = evaluate_policy(source, held, cfg.eval)
        say("before training: " + json.dumps(before.summary()))
    out = run.train(trainer, source, hooks=[*ppo_hooks(source, cfg.guard), *hooks])
    out.before = before
    if held and cfg.eval.after:
        out.after = evaluate_policy(source, held, cfg.eval)
        say("after training: " + json.dumps(out.after.summary()))
    if out.before is not None or out.after is not None:
        say("\nheld-out prompts (" + str(len(held)) + "), one sampled response each:\n"
            + format_eval(out.before, out.after))
        out.files["eval"] = _write_eval(run.run_dir, held, out.before, out.after, cfg.eval.show, say)
    run.save_adapters(source.policy)
    if out.stop_reason:
        say(f"stopped early: {out.stop_reason}")
    return out


def _write_eval(run_dir: str, held: Sequence[Prompt], before: PolicyEval | None, after: PolicyEval | None,
                show: int, say: Callable[[str], None]) -> str:
    out: dict[str, Any] = {name: e.summary() for name, e in (("before", before), ("after", after)) if e is not None}
    if before is not None and after is not None:
        out["comparison"] = _compare(before, after)
        examples = []
        for i in range(min(show, len(held))):
            question = held[i].columns["prompt_messages"][-1]["content"]
            examples.append({"prompt": question, "before": before.texts[i], "before_score": float(before.scores[i]),
                             "after": after.texts[i], "after_score": float(after.scores[i])})
            say(f"\n--- prompt: {question}\n[before, RM {before.scores[i]:+.2f}] {before.texts[i]}\n"
                f"[after,  RM {after.scores[i]:+.2f}] {after.texts[i]}")
        out["examples"] = examples
    path = os.path.join(run_dir, "eval.json")
    if not is_writer():  # one process writes the run's files (tempax.parallel.process)
        return path
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    # Every evaluated response as a {prompt, response} row: `tempax score REWARD_MODEL --input` re-scores them.
    with open(os.path.join(run_dir, "eval_responses.jsonl"), "w") as f:
        for stage, e in (("before", before), ("after", after)):
            for prompt, text, score in zip(held, e.texts if e is not None else [], e.scores if e is not None else []):
                f.write(json.dumps({"stage": stage, "prompt": prompt.columns["prompt_messages"], "response": text,
                                    "score": float(score)}) + "\n")
    return path
