"""Rollout benchmark: GRPO rollouts on the turn-by-turn batch against the continuously batched slot engine.

    python bench/rollout.py                       # both cases, every engine, one run
    python bench/rollout.py --record bench/records/serving.jsonl
    python bench/rollout.py --only "one turn" --engines batch,slots:64     # one case, two engines

SmolLM2-135M-Instruct (the shipped GGUF, float32), GSM8K training questions x 8 completions (G) at temperature
1.0, as a GRPO step samples them (`tempax.rl.episodes.play_episodes`). Two cases:

  one turn    8 questions (64 rows), at most 192 tokens a reply (recipes/grpo_gsm8k_smollm2.yaml's); replies end
              at their own lengths (a stop token or the limit);
  tool turns  4 questions (32 rows), at most 96 tokens a reply, an environment that answers every reply with a
              short tool message and wants 1, 2 or 3 replies (by question), as a tool task's episodes do: the
              batch waits for the longest reply of every turn before any row's tool result goes in, the slot
              engine continues each row as soon as its turn ends.

Engines: `batch` (`DecodeRun`, every row at once, turn by turn), `slots` with a slot per row, and with fewer slots
(groups join as slots free up). Each engine plays the case once with another seed first (compiling its programs),
then `--repeats` times, interleaved with the other engines; the figure is the median generated (policy) tokens
per second, and the ratio to the batch's in the same run. A row draws the same random stream on either engine
(tests/rl/test_episodes.py checks the episodes are equal token for token on a tiny model); on the real model
float rounding differs between the batched and the per-slot decode, so a near-tie can flip a sampled token and the
episodes' token counts differ a little.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K = os.path.join(ROOT, "..", "shared", "data", "gsm8k", "train.jsonl")
GROUP = 8
CASES = {"one turn": {"prompts": 8, "max_new_tokens": 192, "turns": 1, "engines": (("batch", 0), ("slots", 64), ("slots", 16))},
         "tool turns": {"prompts": 4, "max_new_tokens": 96, "turns": 3, "engines": (("batch", 0), ("slots", 32))}}


class ToolTurns:
    """Answers each reply with a short tool message until the episode has had `turns` replies (from the row)."""

    def __init__(self) -> None:
        self.turns, self.replies = 1, 0

    def reset(self, row):
        self.turns, self.replies = int(row["turns"]), 0
        return list(row["prompt_messages"])

    def step(self, reply):
        from tempax.envs.environment import StepResult

        self.replies += 1
        if self.replies >= self.turns:
            return StepResult(rewards={"final": 0.0}, done=True)
        return StepResult(messages=({"role": "tool", "name": "calculator", "content": str(17 * self.replies)},))


def questions(n: int) -> list[dict]:
    rows = []
    with open(GSM8K, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i == n:
                break
            q = json.loads(line)["question"]
            rows.append({"prompt_messages": [{"role": "user", "content": q}], "turns": 1 + i % 3})
    return rows


def measure(repeats: int, cases: dict = CASES) -> list[dict]:
    sys.path.insert(0, ROOT)
    import tempax
    from tempax.envs.environment import SingleTurnEnvironment
    from tempax.rl.episodes import play_episodes
    from tempax.rl.rollout import encode_prompts

    model, tok = tempax.load("smollm2-135m-instruct")
    out = []
    for case, c in cases.items():
        factory = ToolTurns if c["turns"] > 1 else (lambda: SingleTurnEnvironment(tok))
        prompts, _ = encode_prompts(tok, questions(c["prompts"]), max_prompt_len=512, env_factory=factory)
        ids, columns = [p.ids for p in prompts], [p.columns for p in prompts]
        engines = c["engines"]

        def play(engine: str, slots: int, seed: int):
            start = time.perf_counter()
            ep = play_episodes(model, tok, ids, columns, factory, group_size=GROUP, max_new_tokens=c["max_new_tokens"],
                               max_turns=c["turns"], episode_tokens=c["max_new_tokens"] * c["turns"] + 64 * (c["turns"] > 1),
                               temperature=1.0, seed=seed, engine=engine, slots=slots, chunk=16)
            return time.perf_counter() - start, int(ep.mask.sum())

        for e in engines:  # compiles
            play(*e, seed=101)
        times: dict[tuple, list[float]] = {e: [] for e in engines}
        tokens: dict[tuple, list[int]] = {e: [] for e in engines}
        load = [os.getloadavg()[0]]
        for r in range(repeats):
            for e in engines:
                s, n = play(*e, seed=r)
                times[e].append(s)
                tokens[e].append(n)
        load.append(os.getloadavg()[0])
        base = statistics.median(n / s for n, s in zip(tokens[engines[0]], times[engines[0]]))
        for e in engines:
            rate = statistics.median(n / s for n, s in zip(tokens[e], times[e]))
            out.append({"case": case, "rows": c["prompts"] * GROUP, "max_new_tokens": c["max_new_tokens"],
                        "engine": e[0], "slots": e[1] or c["prompts"] * GROUP, "policy_tokens": tokens[e],
                        "seconds": [round(s, 2) for s in times[e]], "tokens_per_s": round(rate, 1),
                        "vs_batch": round(rate / base, 2), "load_1min_before_after": [round(x, 2) for x in load]})
            print(json.dumps(out[-1]), flush=True)
    return out


def table_record(rows: list[dict], repeats: int, command: str = "python bench/rollout.py") -> dict:
    """The run as a table record of the results page's "serving" topic."""
    from tempax.runtime.host import cpu_line

    return {"kind": "table", "topic": "serving",
            "title": f"GRPO rollouts on the slot engine against the turn-by-turn batch: SmolLM2-135M-Instruct "
                     f"(float32), GSM8K questions x {GROUP} completions, temperature 1.0, median of {repeats} "
                     "interleaved repeats",
            "columns": ["case", "rows", "tokens a reply", "engine", "slots", "policy tokens (each repeat)",
                        "policy tokens/s", "vs batch", "1-min load before, after"],
            "rows": [[r["case"], r["rows"], r["max_new_tokens"], r["engine"], r["slots"],
                      ", ".join(str(x) for x in r["policy_tokens"]), r["tokens_per_s"], f"{r['vs_batch']:.2f}x",
                      ", ".join(str(x) for x in r["load_1min_before_after"])] for r in rows],
            "command": command, "cpu": cpu_line(),
            "notes": "tool turns: each reply is answered by a short tool message until the episode has had 1, 2 or "
                     "3 replies (by question). A row draws the same random stream on both engines, but the batched and the "
                     "per-slot decode round differently in float32, so a near-tie can flip a sampled token and the "
                     "episodes' policy tokens differ a little (tests/rl/test_episodes.py checks them equal token for "
                     "token on a tiny model)."}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--record", default=None, help="append the table to this records file (topic 'serving')")
    parser.add_argument("--only", default=None, choices=sorted(CASES), help="run this case alone")
    parser.add_argument("--engines", default=None,
                        help="comma-separated engines to run, e.g. batch,slots:64 (the first is the ratio's base)")
    args = parser.parse_args(argv)
    cases = {k: v for k, v in CASES.items() if args.only in (None, k)}
    if args.engines:
        wanted = [("batch", 0) if e == "batch" else ("slots", int(e.split(":")[1])) for e in args.engines.split(",")]
        cases = {k: dict(v, engines=tuple(e for e in wanted if e in v["engines"])) for k, v in cases.items()}
    rows = measure(args.repeats, cases)
    if args.record:
        with open(args.record, "a", encoding="utf-8") as f:
            given = argv if argv is not None else sys.argv[1:]
            kept = [a for i, a in enumerate(given) if a != "--record" and (i == 0 or given[i - 1] != "--record")
                    and not a.startswith("--record=")]
            command = " ".join(["python bench/rollout.py"] + [f'"{a}"' if " " in a else a for a in kept])
            f.write(json.dumps(table_record(rows, args.repeats, command)) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    from tempax.runtime.process import setup_process

    setup_process()  # as the `tempax` command does
    sys.exit(main())
