"""The algorithm runs a pipeline chains: each calls an algorithm's own `main` on the model in memory (so stages
share one loaded model instead of reading checkpoints back) and returns the trained model with its LoRA adapters
merged into the weights, ready for the next stage or the evaluation.

The runs keep their algorithm's run dir, metrics and checkpoints as configured; their `log` is silenced, and what
a stage says is one line in the pipeline's voice (`say`).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from tempax.algorithms.grpo.config import GRPOConfig
from tempax.algorithms.grpo.main import main as grpo_main
from tempax.algorithms.rft.config import RFTConfig
from tempax.algorithms.rft.main import main as rft_main
from tempax.algorithms.sft.main import SFTConfig
from tempax.algorithms.sft.main import main as sft_main
from tempax.models.lora import merge_lora
from tempax.train.config import CheckpointConfig, MeshConfig, TrainConfig
from tempax.train.hooks import every
from tempax.train.loop import TrainResult


def in_memory_train(**settings: Any) -> TrainConfig:
    """The loop settings of a stage run in memory within a pipeline: one device, no checkpoints (the next stage
    takes the model from memory, and a demo's run is not resumed), no memory plan (the stages are small); the
    stage's own `settings` (steps, batch size, optimizer...) on top."""
    return TrainConfig(mesh=MeshConfig(num_devices=1), checkpoint=CheckpointConfig(save_at_end=False, resume=False),
                       check_memory=False, **settings)


def _quiet(text: str) -> None:
    """The algorithms' own log lines: the pipeline says what a stage did itself."""


def write_sft_examples(rows: list[dict[str, Any]], path: str, limit: int) -> int:
    """The first `limit` rows with a target as chat examples (prompt + ideal answer) in a jsonl; how many."""
    n = 0
    with open(path, "w") as f:
        for r in rows[:limit]:
            if r.get("target"):
                f.write(json.dumps({"messages": list(r["prompt_messages"]) +
                                    [{"role": "assistant", "content": r["target"]}]}) + "\n")
                n += 1
    return n


def sft_rows_used(cfg: SFTConfig) -> int:
    """How many task rows `run_sft` offers a warm-start by default: what its steps can use, with room for the
    packer (about 2 problems fit a row), so a later stage can continue on the rows after them."""
    return cfg.train.steps * cfg.train.batch_size * 4


def run_sft(model: Any, tokenizer: Any, rows: list[dict[str, Any]], cfg: SFTConfig,
            say: Callable[[str], None], *, hooks: tuple = (), label: str = "SFT",
            limit: int | None = None) -> tuple[Any, int]:
    """`sft.main` on the targets of the first `limit` rows (default: `sft_rows_used`), written to `cfg.data.path`,
    with the in-memory model; (the trained model, adapters merged; steps run)."""
    n = write_sft_examples(rows, cfg.data.path, sft_rows_used(cfg) if limit is None else limit)
    result = sft_main(cfg, hooks=hooks, log=_quiet, model=model, tokenizer=tokenizer)
    step, last = result.history[-1] if result.history else (0, {})
    say(f"  {label}: {n} examples, {step} steps, final loss {last.get('loss', float('nan')):.3f}"
        + (f" ({result.stop_reason})" if result.stop_reason else ""))
    return merged(result.model, cfg.lora), step


def run_grpo(model: Any, tokenizer: Any, cfg: GRPOConfig, write: Callable[[str], None] | None = None, *,
             hooks: tuple = ()) -> Any:
    """`grpo.main` on the in-memory model (the reference), with `hooks` (a budget) and a progress line every ~1/6
    of the steps (through `write`, or above the progress bar); returns its `RunResult` (`.model`: the policy)."""
    steps = cfg.train.steps

    def report(info: Any) -> None:
        m = info.metrics()
        (write or info.trainer.write)(
            f"  step {info.step:3d}/{steps}: reward {m['reward/total_mean']:.2f} (format "
            f"{m['reward/format_mean']:.2f}, correct {m['reward/correctness_mean']:.2f}), groups without "
            f"spread {m['groups/zero_spread_frac']:.0%}, entropy {m.get('entropy', float('nan')):.2f}, "
            f"{m['perf/step_s']:.0f} s/step")

    return grpo_main(cfg, hooks=(*hooks, every(max(1, steps // 6), report, at_end=True)), log=_quiet,
                     model=model, tokenizer=tokenizer)


def run_rft(model: Any, tokenizer: Any, cfg: RFTConfig, say: Callable[[str], None], *,
            hooks: tuple = ()) -> tuple[Any, TrainResult]:
    """`rft.main` on the in-memory model; (the trained model, adapters merged; its TrainResult)."""
    result = rft_main(cfg, hooks=hooks, log=_quiet, model=model, tokenizer=tokenizer)
    steps = last_step(result)
    rewards = [v for _, v in result.series("reward/total_mean")]
    accept = [v for _, v in result.series("rft/accept_rate")]
    kept = sum(v for _, v in result.series("rft/kept"))
    if rewards:
        say(f"  RFT: {len(rewards)} rounds, {steps} steps, {kept:.0f} kept completions; sampled reward "
            f"{rewards[0]:.2f} -> {rewards[-1]:.2f}, accept rate {accept[0]:.0%} -> {accept[-1]:.0%} (first / last "
            "round)" + (f" ({result.stop_reason})" if result.stop_reason else ""))
    return merged(result.model, cfg.lora), result


def merged(model: Any, lora: Any) -> Any:
    """The model with its adapters folded into the weights when the stage trained adapters (`lora` set)."""
    return merge_lora(model) if lora is not None else model


def last_step(result: TrainResult) -> int:
    """The step a run reached (0 when it recorded none)."""
    return result.history[-1][0] if result.history else 0
