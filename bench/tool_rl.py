"""Does GRPO add to a tool warm-start on a user's own tool? SmolLM2-135M-Instruct on the shop task of the guide's
worked example (`examples/price_tools.py`: a user's `price_of` tool beside the calculator), every model scored on
the same held-out baskets.

    python bench/tool_rl.py                            # the three stages below and their evaluations (over 1 h)
    python bench/tool_rl.py --table runs/tool_rl       # the table of a finished (or stopped) run, run nothing
    python bench/tool_rl.py --table runs/tool_rl --record bench/records/tools.jsonl   # ... and onto the page

The user path, as the guide describes it, with the shipped recipes' settings (none tuned on the held-out baskets):
  warm-start     `recipes/sft_price_tools.yaml`: LoRA SFT on the 48 tool-calling transcripts that
                 `tempax data episodes` wrote with the example's scripted policy (`examples/price_episodes.jsonl`);
  GRPO           `recipes/grpo_price_tools.yaml` from the warm-start, on `--prompts` new baskets (questions and
                 reference totals only, no transcripts), the `tools` environment with the user's tool;
  more SFT       the baseline a user would otherwise pick: the warm-start's SFT continued on the same 48
                 transcripts, from the warm-start, for GRPO's process-CPU seconds, at GRPO's learning rate.
Baskets are two or three items of 1-4 each from the shop's 12 (as the shipped task file); the held-out baskets,
the RL prompts and the transcripts' baskets are three disjoint sets. Each model plays greedy episodes with the
tools on the held-out baskets; a basket is right when the final reply's <answer> is the total. The table: answer
accuracy with its Wilson interval, and paired differences (Newcombe's interval for paired proportions,
`tempax.eval.metrics`) GRPO - warm-start and GRPO - more SFT, on the same baskets.

Written to OUT as it goes: `outcomes.jsonl` (per stage, per basket; `tempax.experiments.pipeline`), `stages.json`
(each stage's wall and CPU seconds and steps), `log.txt`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.code_task import gain, rate  # noqa: E402  (a rate with its interval, a paired difference with its)
from tempax.runtime.host import cpu_line  # noqa: E402

SFT_RECIPE = "recipes/sft_price_tools.yaml"
GRPO_RECIPE = "recipes/grpo_price_tools.yaml"
TOOLS = "examples/price_tools.py"
STAGES = ("warm-start (SFT on 48 transcripts)", "GRPO from the warm-start", "more SFT on the same transcripts")


def shop() -> tuple[Any, list[str]]:
    """The user's `basket_row` and the shop's item names, loaded from `examples/price_tools.py` as the recipe
    loads its tool."""
    from tempax.envs.registry import load_object
    return load_object(f"{TOOLS}:basket_row", "bench"), sorted(load_object(f"{TOOLS}:PRICES_CENTS", "bench"))


def basket_key(row: dict[str, Any]) -> tuple:
    return tuple(sorted((name, int(count)) for name, count in row["items"]))


def new_baskets(count: int, seed: int, taken: set[tuple]) -> list[dict[str, Any]]:
    """`count` baskets of two or three items (1-4 each), none of whose item lists is in `taken` (which grows)."""
    basket_row, names = shop()
    rng, rows = random.Random(seed), []
    while len(rows) < count:
        items = [[name, rng.randint(1, 4)] for name in rng.sample(names, rng.randint(2, 3))]
        row = basket_row(items)
        if basket_key(row) not in taken:
            taken.add(basket_key(row))
            rows.append(row)
    return rows


def run_all(out: str, held_out: int, prompts: int, grpo_steps: int, eval_batch: int, seed: int) -> None:
    import numpy as np

    from tempax.algorithms.episode_eval import evaluate_task
    from tempax.algorithms.grpo.main import main as grpo_main
    from tempax.algorithms.registry import load_recipe
    from tempax.algorithms.sft.main import main as sft_main
    from tempax.data.tasks.spec import read_task_rows
    from tempax.eval.evaluate import EvalOptions
    from tempax.experiments.budget import Budget, Stopwatch
    from tempax.experiments.pipeline import Pipeline
    from tempax.experiments.stages import merged
    from tempax.train.config import CheckpointConfig, OptimizerConfig

    os.makedirs(out, exist_ok=True)
    log_file = open(os.path.join(out, "log.txt"), "a")

    def say(text: str) -> None:
        print(text, flush=True)
        log_file.write(text + "\n")
        log_file.flush()

    sft_cfg = load_recipe("sft", SFT_RECIPE, [])
    grpo_cfg = load_recipe("grpo", GRPO_RECIPE, [])
    taken = {basket_key(r) for r in read_task_rows(grpo_cfg.task.source)}  # the transcripts' baskets
    held_rows = new_baskets(held_out, seed + 1, taken)
    prompt_path = os.path.join(out, "prompts.jsonl")
    with open(prompt_path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in new_baskets(prompts, seed + 2, taken))
    with open(os.path.join(out, "held_out.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in held_rows)

    def in_memory(train: Any, name: str, **changes: Any) -> Any:
        return dataclasses.replace(train, run_dir=os.path.join(out, name), seed=seed, progress_bar=False,
                                   check_memory=False, checkpoint=CheckpointConfig(save_at_end=False, resume=False),
                                   **changes)

    model, tokenizer = sft_cfg.model.build(seed=seed)
    env = grpo_cfg.env
    factory = env.build(tokenizer)
    max_new = grpo_cfg.grpo.max_new_tokens
    options = EvalOptions(max_new_tokens=max_new, greedy=True, group_size=0, batch_size=eval_batch)
    episode_tokens = env.episode_tokens(max_new, key="grpo.max_new_tokens")
    notes: dict[str, str] = {}

    def evaluate(row: str, policy: Any) -> Any:
        said: list[str] = []
        r = evaluate_task(policy, tokenizer, held_rows, options, env_factory=factory, max_turns=env.max_turns,
                          episode_tokens=episode_tokens, label=row, log=said.append)
        notes[row] = said[0].split(": ", 1)[-1] if said else ""
        return r

    watch = Stopwatch()
    pipe = Pipeline(out, watch=watch, say=say, evaluate=evaluate,
                    line=lambda row, r, seconds: f"  {row}: answer {r.answer_accuracy:.1%} on {len(held_rows)} "
                                                 f"held-out baskets ({seconds:.0f} s); {notes.get(row, '')}")
    stages: dict[str, Any] = {"cpu": cpu_line(), "held_out": held_out, "prompts": prompts}

    def record(row: str, name: str, steps: int) -> None:
        stages[row] = {"wall_s": watch.wall[name], "cpu_s": watch.cpu[name], "steps": steps}
        with open(os.path.join(out, "stages.json"), "w") as f:
            json.dump(stages, f, indent=2)

    say(f"bench/tool_rl.py: {len(held_rows)} held-out baskets, {prompts} RL prompts; {cpu_line()}")
    say(f"[1/3] warm-start: {SFT_RECIPE}")
    warm_cfg = dataclasses.replace(sft_cfg, train=in_memory(sft_cfg.train, "warm_start"))
    result = pipe.train("warm", lambda: sft_main(warm_cfg, log=lambda text: None, model=model, tokenizer=tokenizer))
    warm = merged(result.model, warm_cfg.lora)
    record(STAGES[0], "warm", result.history[-1][0])
    pipe.evaluate(STAGES[0], warm, trained="warm")

    say(f"[2/3] GRPO: {GRPO_RECIPE}, {grpo_steps} steps from the warm-start")
    g_cfg = dataclasses.replace(grpo_cfg, task=dataclasses.replace(grpo_cfg.task, source=prompt_path),
                                train=in_memory(grpo_cfg.train, "grpo", steps=grpo_steps))
    run = pipe.train("grpo", lambda: grpo_main(g_cfg, log=lambda text: None, model=warm, tokenizer=tokenizer))
    history = [m for _, m in run.history]
    rewards = [m["reward/total_mean"] for m in history]
    say(f"  {len(history)} steps in {watch.wall['grpo']:.0f} s wall, {watch.cpu['grpo']:.0f} s CPU; reward "
        f"{np.mean(rewards[:3]):.2f} -> {np.mean(rewards[-3:]):.2f} (first / last 3 steps); tool calls per "
        f"episode {np.mean([m.get('episode/tool_calls_mean', float('nan')) for m in history[-3:]]):.2f} (last 3)")
    stages["grpo_rewards"] = rewards
    record(STAGES[1], "grpo", len(history))
    pipe.evaluate(STAGES[1], merged(run.model, g_cfg.lora), trained="grpo")
    del run

    equal = Budget.of(watch, "grpo", "cpu", label="GRPO")
    say(f"[3/3] more SFT on the same transcripts for GRPO's {equal.seconds:.0f} process-CPU seconds, at GRPO's "
        f"learning rate {grpo_cfg.train.optimizer.learning_rate:g} (constant)")
    more_cfg = dataclasses.replace(sft_cfg, train=in_memory(
        sft_cfg.train, "more_sft", steps=10_000, optimizer=OptimizerConfig(
            learning_rate=grpo_cfg.train.optimizer.learning_rate, schedule="constant", warmup_steps=0)))

    def more_sft(hook: Any) -> tuple[Any, int]:
        r = sft_main(more_cfg, hooks=(hook,), log=lambda text: None, model=warm, tokenizer=tokenizer)
        return merged(r.model, more_cfg.lora), r.history[-1][0]

    pipe.budgeted(STAGES[2], "more_sft", equal, more_sft)
    record(STAGES[2], "more_sft", pipe.budgeted_stages[STAGES[2]]["steps"])
    say("")
    say(table(out))


def read_outcomes(out: str) -> dict[str, list[bool]]:
    """Stage -> per held-out basket, right or not (the last evaluation of each stage in `outcomes.jsonl`)."""
    found: dict[str, list[bool]] = {}
    try:
        with open(os.path.join(out, "outcomes.jsonl")) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    found[r["stage"]] = [bool(c) for c in r["correct"]]
    except OSError:
        pass
    return found


COLUMNS = ["stage", "steps", "training wall / CPU s", "answer accuracy, 95% CI", "GRPO - this, paired"]


def table_rows(out: str) -> list[list[str]]:
    found = read_outcomes(out)
    try:
        with open(os.path.join(out, "stages.json")) as f:
            spent = json.load(f)
    except OSError:
        spent = {}
    grpo = found.get(STAGES[1])
    rows = []
    for stage in STAGES:
        if stage not in found:
            rows.append([stage, "not run", "-", "-", "-"])
            continue
        s = spent.get(stage)
        rows.append([stage, str(s["steps"]) if s else "-", f"{s['wall_s']:.0f} / {s['cpu_s']:.0f}" if s else "-",
                     rate(found[stage]),
                     gain(grpo, found[stage]) if grpo is not None and stage != STAGES[1] else "-"])
    return rows


def table(out: str) -> str:
    rows = table_rows(out)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/tool_rl")
    parser.add_argument("--table", metavar="OUT", help="print the table of the run in OUT, run nothing")
    parser.add_argument("--held-out", type=int, default=200, help="held-out baskets every model is scored on")
    parser.add_argument("--prompts", type=int, default=256, help="new baskets GRPO draws its prompts from")
    parser.add_argument("--grpo-steps", type=int, default=20, help="GRPO steps (the recipe's train.steps)")
    parser.add_argument("--eval-batch", type=int, default=100, help="baskets played together in an evaluation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", metavar="FILE", help="append the table as a bench/results.py record")
    parser.add_argument("--notes", default="", help="what else the record should say (e.g. the machine's load)")
    args = parser.parse_args(argv)
    os.chdir(REPO)  # the recipes name the user's files relative to the repository root
    out = args.table or args.out
    if not args.table:
        start = time.perf_counter()
        run_all(out, args.held_out, args.prompts, args.grpo_steps, args.eval_batch, args.seed)
        print(f"total {time.perf_counter() - start:.0f} s wall")
    else:
        print(table(out))
    if args.record:
        found = read_outcomes(out)
        n = len(next(iter(found.values()))) if found else 0
        record = {"kind": "table", "topic": "learning", "title": f"GRPO on a user's own tool: the shop task of the "
                  f"guide's worked example, {n} held-out baskets", "columns": COLUMNS, "rows": table_rows(out),
                  "command": "python bench/tool_rl.py", "cpu": cpu_line(),
                  "notes": f"SmolLM2-135M-Instruct, LoRA; {SFT_RECIPE} and {GRPO_RECIPE} as shipped (GRPO on new "
                           "baskets without transcripts); more SFT: the warm-start's recipe continued on the same "
                           "transcripts for GRPO's process-CPU seconds at GRPO's learning rate; greedy episodes with "
                           "the tools" + (f"; {args.notes}" if args.notes else "")}
        with open(args.record, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
