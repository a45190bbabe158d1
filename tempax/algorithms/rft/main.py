"""`tempax rft --config RECIPE.yaml`: rejection-sampling fine-tuning (RFT, STaR, ReST-EM, expert iteration).

    cfg = load_config(RFTConfig, "recipes/rft_arithmetic_smollm2.yaml", ["train.steps=20"])
    run = main(cfg)

`main` builds the model (LoRA/QLoRA when configured), the task's problems, the checker (the reward functions,
`rft.threshold`), the trainer with `make_rft_loss` and the round source (`RFTSource`), trains with `Trainer.fit`;
evaluates on the held-out split before and after training (answer and format accuracy, greedy); and writes
config.yaml, metrics.jsonl / TensorBoard, checkpoints, eval.json and the adapters into `train.run_dir`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import jax
from flax import nnx

from tempax.algorithms.common import build_model
from tempax.algorithms.rft.config import RFTConfig, RFTSettings
from tempax.algorithms.rft.source import RFTSource
from tempax.algorithms.run import start_run
from tempax.data.tasks.spec import load_task
from tempax.errors import ConfigError
from tempax.eval.spec import eval_options
from tempax.models.fused_head import fused_causal_lm_loss, lm_head_of
from tempax.rewards.registry import build_rewards
from tempax.rl.rollout import PromptSampler, encode_prompts, round_up
from tempax.train.loop import Trainer, TrainResult
from tempax.train.trainable import Trainable

__all__ = ["RFTConfig", "RFTRun", "RFTSettings", "main", "make_rft_loss", "PLOT_METRICS"]

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


@dataclass
class RFTRun:
    """What `main` returns: the training result, evaluations, the round source and the trained policy."""

    result: TrainResult
    source: RFTSource
    policy: Any
    before: Any = None
    after: Any = None
    files: dict[str, str] = field(default_factory=dict)


def main(
    cfg: RFTConfig,
    *,
    hooks: tuple = (),
    log: Callable[[str], None] | None = None,
    model: Any = None,
    tokenizer: Any = None,
) -> RFTRun:
    """Trains per `cfg` (see the module docstring). `model` / `tokenizer`: an already built starting policy (LoRA
    adapters, when `cfg.lora` is set, are applied here) instead of loading `cfg.model` (`tempax demo` passes its
    warm-started model)."""
    from tempax.eval.evaluate import evaluate, format_table

    run = start_run(cfg, log=log)
    say = run.say
    mesh = cfg.train.mesh.build()
    if model is None:
        model, built_tokenizer = cfg.model.build(seed=cfg.train.seed, mesh=mesh)
        tokenizer = tokenizer or built_tokenizer
    if tokenizer is None:
        raise ConfigError(f"model.source={cfg.model.source} has no tokenizer; set model.tokenizer")
    s = cfg.rft
    train_rows, held_rows = load_task(cfg.task, eval_problems=cfg.eval.num_problems)
    prompts, dropped = encode_prompts(tokenizer, train_rows, max_prompt_len=s.max_prompt_len)
    say(f"task {cfg.task.name}: {len(prompts)} training problems ({dropped} longer than rft.max_prompt_len="
        f"{s.max_prompt_len} dropped), {len(held_rows)} held-out problems")
    longest = max(len(p.ids) for p in prompts)
    if longest + s.max_new_tokens > cfg.train.seq_len:
        raise ConfigError(
            f"a kept completion (prompt up to {longest} tokens + rft.max_new_tokens={s.max_new_tokens}) may not fit "
            f"train.seq_len={cfg.train.seq_len}; set train.seq_len={round_up(longest + s.max_new_tokens, 8)} or "
            "lower rft.max_new_tokens / rft.max_prompt_len")
    options = eval_options(cfg.eval, s.max_new_tokens, seed=cfg.train.seed)
    before = after = None
    if held_rows and cfg.eval.before:
        before = evaluate(model, tokenizer, held_rows, options)  # before the (zero-initialised) adapters go on
        say(f"before training: {before.summary_line()}")
    model, tokenizer, trainable = build_model(cfg, mesh, model=model, tokenizer=tokenizer)
    source = RFTSource(tokenizer, PromptSampler(prompts, seed=cfg.train.seed), build_rewards(cfg.rewards), s)
    trainer = Trainer(Trainable(model, logit_positions=64), make_rft_loss(), cfg.train, trainable=trainable, mesh=mesh,
                      log=say, checkpoint_meta={"algorithm": "RFT", "model_source": cfg.model.source})
    del model  # the trainer holds the weights now
    result = run.train(trainer, source, hooks=list(hooks))
    policy = trainer.model
    rft_run = RFTRun(result=result, source=source, policy=policy, before=before, files=run.files)
    if held_rows and cfg.eval.after:
        from tempax.models.lora import merge_lora

        after = evaluate(merge_lora(policy) if cfg.lora is not None else policy, tokenizer, held_rows, options)
        rft_run.after = after
        say(f"after training: {after.summary_line()}")
    stages = [(name, r) for name, r in (("before", before), ("after", after)) if r is not None]
    if stages:
        last = result.history[-1][0] if result.history else 0
        run.report_stages(stages, table=format_table(stages), file="eval.json", steps={"before": 0, "after": last})
    if cfg.lora is not None:
        from tempax.models.lora import save_adapters

        run.files["adapters"] = save_adapters(policy, run.path("adapters"), base_model_name_or_path=cfg.model.source)
    if result.stop_reason:
        say(f"stopped early: {result.stop_reason}")
    rewards = result.series("reward/total_mean")
    if rewards:
        say(f"sampled reward per round: {rewards[0][1]:.2f} -> {rewards[-1][1]:.2f} over {len(rewards)} rounds")
    say(f"done: run dir {run.run_dir} (curves: tempax plot {run.run_dir} --metrics {','.join(PLOT_METRICS[:3])})")
    return rft_run
