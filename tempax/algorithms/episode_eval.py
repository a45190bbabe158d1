"""Held-out evaluation of a run that plays an environment: greedy episodes, each final reply checked the way
`tempax.eval.evaluate` checks a one-turn completion (format and answer), so the stage tables compare alike.
Shared by the algorithms whose rollouts are episodes (GRPO and its variants, RFT)."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from tempax.envs.registry import EnvFactory
from tempax.errors import DataError
from tempax.eval.evaluate import EvalOptions, Scored, TaskEvaluation, evaluate, score_row
from tempax.eval.metrics import summarize
from tempax.rl.episodes import play_episodes
from tempax.rl.rollout import encode_prompts


def evaluate_episodes(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    env_factory: EnvFactory,
    *,
    max_new_tokens: int,
    max_turns: int,
    episode_tokens: int,
    batch_size: int = 32,
) -> tuple[TaskEvaluation, dict[str, float]]:
    """Greedy episodes on held-out rows (`answer` column), each final reply checked like `tempax.eval.evaluate`
    checks a completion: (the evaluation, episode metrics: turns and the environments' counters per episode)."""
    if not rows:
        raise DataError("no evaluation problems given")
    t0 = time.perf_counter()
    prompts, _ = encode_prompts(tokenizer, rows, max_prompt_len=1 << 30, env_factory=env_factory)
    records: list[Scored] = []
    counters: dict[str, float] = {}
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        episodes = play_episodes(
            model, tokenizer, [q.ids for q in chunk], [q.columns for q in chunk], env_factory, group_size=1,
            max_new_tokens=max_new_tokens, max_turns=max_turns, episode_tokens=episode_tokens, temperature=0.0,
        )
        counters["turns"] = counters.get("turns", 0.0) + float(episodes.turns.sum())
        for name, values in episodes.env_metrics.items():
            counters[name] = counters.get(name, 0.0) + float(values.sum())
        for i, q in enumerate(chunk):
            fmt, correct, timed_out = score_row([episodes.final_texts[i]], q.columns)
            records.append(Scored(str(q.columns.get("question", "")), str(q.columns["answer"]),
                                  [episodes.texts[i]], fmt, correct, [int(episodes.lengths[i])], timed_out))
    summary = summarize([r.format_ok for r in records], [r.correct for r in records], [r.lengths for r in records])
    evaluation = TaskEvaluation(summary, None, records, [], time.perf_counter() - t0)
    return evaluation, {f"{k}_per_episode": v / len(records) for k, v in counters.items()}


def evaluate_task(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    options: EvalOptions,
    *,
    env_factory: EnvFactory | None,
    max_turns: int,
    episode_tokens: int,
    label: str = "eval",
    log: Callable[[str], None] | None = None,
) -> TaskEvaluation:
    """The held-out evaluation of a run: `tempax.eval.evaluate` for one-turn tasks, greedy episodes
    (`evaluate_episodes`, their counters said through `log`) when the run plays an environment."""
    if env_factory is None:
        return evaluate(model, tokenizer, rows, options, label=label)
    evaluation, counts = evaluate_episodes(
        model, tokenizer, rows, env_factory, max_new_tokens=options.max_new_tokens, max_turns=max_turns,
        episode_tokens=episode_tokens, batch_size=options.batch_size)
    if log is not None:
        log(f"{label}: greedy episodes, " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(counts.items())))
    return evaluation


def episode_evaluation(
    env_factory: EnvFactory | None, max_turns: int, episode_tokens: int, log: Callable[[str], None]
) -> Callable[..., TaskEvaluation] | None:
    """The evaluation function of a run whose episodes play `env_factory`'s environment for up to `max_turns`
    replies in `episode_tokens` (`evaluate`'s signature), or None for one-turn tasks (the plain
    `tempax.eval.evaluate.evaluate` then)."""
    if env_factory is None:
        return None

    def evaluate_fn(model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], options: EvalOptions, *,
                    label: str = "eval") -> TaskEvaluation:
        return evaluate_task(model, tokenizer, rows, options, env_factory=env_factory, max_turns=max_turns,
                             episode_tokens=episode_tokens, label=label, log=log)

    return evaluate_fn
