"""`tempax rft --config RECIPE.yaml`: rejection-sampling fine-tuning (RFT, STaR, ReST-EM, expert iteration).

    cfg = load_config(RFTConfig, "recipes/rft_arithmetic_smollm2.yaml", ["train.steps=20"])
    run = main(cfg)

`main` reads top to bottom: it starts the run; builds the model (LoRA/QLoRA when configured), the task's problems,
the checker (the reward functions, `rft.threshold`), the round source (`RFTSource`) and the trainer with
`make_rft_loss`; evaluates the starting policy on the held-out split (answer and format accuracy, greedy); trains
with `Trainer.fit` (`Run.train`); and finishes with the evaluation after training (`finish_policy`). It writes
config.yaml, metrics.jsonl / TensorBoard, checkpoints, eval.json and the adapters into `train.run_dir`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
from flax import nnx

from tempax.algorithms.common import base_model, build_model
from tempax.algorithms.rft.config import RFTConfig, RFTKnobsConfig
from tempax.algorithms.episode_eval import episode_evaluation
from tempax.algorithms.rft.source import RFTSource
from tempax.algorithms.run import RunResult, evaluate_before, finish_policy, make_trainer, start_run, task_prompts
from tempax.errors import ConfigError
from tempax.eval.spec import eval_options
from tempax.models.decoder import lm_head_of
from tempax.ops import fused_causal_lm_loss
from tempax.rewards.registry import build_rewards
from tempax.rl.rollout import PromptSampler, round_up
from tempax.train.trainable import Trainable

__all__ = ["RFTConfig", "RFTKnobsConfig", "RunResult", "main", "make_rft_loss", "PLOT_METRICS"]

# The curves worth plotting (`tempax plot RUN_DIR --metrics ...`).
PLOT_METRICS = ("reward/total_mean", "rft/accept_rate", "rft/kept_per_problem", "loss", "rft/duplicates_dropped")


def make_rft_loss(*, chunk_len: int | None = 64) -> Callable[[nnx.Module, dict[str, jax.Array]], tuple[jax.Array, dict]]:
    """`loss_fn(model, batch)` for the shared train step: `losses.weighted_sft_loss` over the batch's packed
    kept completions, computed by the fused LM head + cross-entropy (no [B, T, V] logits kept): the weighted mask
    `loss_mask * weights` in place of the 0/1 mask gives exactly the weighted token mean, and its sum (the
    fused loss's `num_tokens`) is the `loss_weight` that keeps gradient accumulation exact."""

    def loss_fn(model: nnx.Module, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        hidden_btd, _ = model.hidden_states(batch["tokens"], positions=batch["positions"],
                                            segment_ids=batch["segment_ids"])
        head, vocab_major = lm_head_of(model, master=True)
        weighted_mask = batch["loss_mask"].astype(jax.numpy.float32) * batch["weights"]
        loss, metrics = fused_causal_lm_loss(hidden_btd, head, batch["targets"], weighted_mask,
                                             vocab_major=vocab_major, chunk_len=chunk_len,
                                             softcap=model.config.final_logit_softcap)
        return loss, {"loss": loss, "loss_weight": metrics["num_tokens"],
                      "token_accuracy": metrics["token_accuracy"]}

    return loss_fn


def main(
    cfg: RFTConfig,
    *,
    hooks: tuple = (),
    log: Callable[[str], None] | None = None,
    model: Any = None,
    tokenizer: Any = None,
) -> RunResult:
    """Trains per `cfg` (see the module docstring). `model` / `tokenizer`: an already built starting policy (LoRA
    adapters, when `cfg.lora` is set, are applied here) instead of loading `cfg.model` (`tempax demo` passes its
    warm-started model)."""

    s = cfg.rft
    run = start_run(cfg, log=log)
    base, tok = base_model(cfg, run.mesh, model=model, tokenizer=tokenizer)
    env_factory = None if cfg.env.single_turn else cfg.env.build(tok)
    prompts, held_rows = task_prompts(run, tok, max_prompt_len=s.max_prompt_len, section="rft", what="problems",
                                      env_factory=env_factory)
    longest = max(len(p.ids) for p in prompts)
    completion = cfg.env.episode_tokens(s.max_new_tokens, key="rft.max_new_tokens")
    if longest + completion > cfg.train.seq_len:
        raise ConfigError(
            f"a kept completion (prompt up to {longest} tokens + {completion} completion or episode tokens) may "
            f"not fit train.seq_len={cfg.train.seq_len}; set train.seq_len={round_up(longest + completion, 8)} "
            "or lower rft.max_new_tokens / rft.max_prompt_len / env.max_episode_tokens")
    options = eval_options(cfg.eval, s.max_new_tokens, seed=cfg.train.seed)
    evaluate_fn = episode_evaluation(env_factory, cfg.env.max_turns, completion, run.say)
    # The starting policy is evaluated before its (zero-initialised) adapters go on.
    before = evaluate_before(run, base, tok, held_rows, options, evaluate_fn=evaluate_fn)
    policy, tok, trainable = build_model(cfg, run.mesh, model=base, tokenizer=tok)
    source = RFTSource(tok, PromptSampler(prompts, seed=cfg.train.seed), build_rewards(cfg.rewards), s,
                       env_factory=env_factory, max_turns=cfg.env.max_turns, episode_tokens=completion)
    trainer = make_trainer(cfg, Trainable(policy, logit_positions=64), make_rft_loss(), algorithm="RFT",
                           trainable=trainable, mesh=run.mesh, log=run.say)
    del base, policy  # the trainer holds the weights now
    result = run.train(trainer, source, hooks=hooks)
    result = finish_policy(run, result, tokenizer=tok, held_rows=held_rows, options=options, before=before,
                           evaluate_fn=evaluate_fn)
    rewards = result.series("reward/total_mean")
    if rewards:
        run.say(f"sampled reward per round: {rewards[0][1]:.2f} -> {rewards[-1][1]:.2f} over {len(rewards)} rounds")
    run.say(f"done: run dir {run.run_dir} (curves: tempax plot {run.run_dir} --metrics {','.join(PLOT_METRICS[:3])})")
    return result
