"""Learning as well as TRL: each recipe through tempax and through TRL's trainer, same start, data and budget.

    python bench/learning_trl.py --peer trl                      # every row on SmolLM2-135M-Instruct
    python bench/learning_trl.py --peer trl --only kto,dpo       # some rows; the others print "not run"
    python bench/learning_trl.py --peer trl --tiny --out DIR     # smoke: 2 steps a row on a tiny model
    python bench/learning_trl.py --table DIR                     # the table of runs already in DIR
    python bench/learning_trl.py --table DIR --record bench/records/learning.jsonl   # ... and onto docs/results.md

What is held equal, per row:
  * the starting weights: the Hugging Face folder `tempax export` writes (`base/` in the output folder; with
    --tiny, the tiny-llama preset and the test kit's tokenizer), which tempax trains from as `model.source` and
    TRL loads with `from_pretrained`, so both start bit-identical;
  * the rows, their tokens and their order: tempax's recipe tokenises the data and its loader fixes the order and
    the batches; TRL gets those token ids pre-tokenised in that order (its `_prepare_dataset` is bypassed,
    `train_sampling_strategy` is sequential): DPO's pairs, KTO's rows with tempax's mismatched rows for the KL
    reference point, SFT's packed rows with their per-example lengths, the reward model's chosen / rejected
    sequences; GRPO's prompts as tempax's sampler draws them, as tempax's token ids;
  * the starting trainable weights: tempax's seeded LoRA adapters read into PEFT (rank / alpha / target modules
    match by construction, dropout 0), and for the reward model tempax's initial scalar head as transformers'
    `score` layer; AdamW (betas, eps, weight decay, clipping), the learning rate of every update (tempax's warm-up
    and schedule, step for step: `lr_factors`), the batch (in examples), the steps, beta / the KTO weights, the
    seed, the reference (the base with adapters switched off on both sides);
  * the evaluation, by tempax's code, on both final models: TRL's adapter is read back through the PEFT round trip
    (`tempax.models.lora.load_adapters`), tempax's is exported in the same layout (`tempax export RUN --adapters`;
    the reward model: the folder its run saves, and TRL's adapters merged with its head beside them).

Rows and their metric: DPO and KTO, preference accuracy of the implicit rewards beta (log pi - log ref) on the
held-out pairs (>= 200 in the full run); the reward model, the preference accuracy of its scores on the same
pairs; SFT, each held-out example's mean token loss (200 examples split off the recipe's rows); GRPO on the
demo's arithmetic task (the demo's GRPO stage from its SFT warm-start, which the preparation writes as the row's
start), greedy answer accuracy on 200 held-out problems. GRPO's sampling cannot be equal across the libraries, so
its row compares one run of each, not one run twice (bench/trl_sides/grpo.py). For each row: metric before -> after
for both, the paired difference tempax - TRL with its 95% interval (Newcombe's for paired proportions,
`tempax.eval.metrics`; for losses the paired t interval), the wall and CPU seconds (user + system of the training
process) of each side, the versions of both libraries and the CPU.

Each side trains in its own child process: tempax's command (without its own held-out evaluation), and TRL's
trainer in a process that imports no JAX (`--side trl`), after a preparation child (`--prepare`, not counted in
either budget) has written tempax's tokens, order and initial weights for it (and for SFT split the rows). The
evaluation runs in a fourth (`--evaluate`). The last column, each side's first and last training loss, checks
that the two runs are one run: from the same start on the same rows the first losses agree to float rounding.
Files: OUT/ROW/{tempax,trl}/, OUT/ROW/{tempax,trl}.budget.json, OUT/ROW/outcomes.json (per-item outcomes and
per-step training losses). The TRL sides live in bench/trl_sides/.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.trl_sides.common import SIDES, TrlSide, train_trl, write_inputs  # noqa: E402
from bench.trl_sides.grpo import GRPO_SIDE, evaluate_answers, warm_start  # noqa: E402
from bench.trl_sides.preference import DPO_SIDE, KTO_SIDE, evaluate_implicit_rewards  # noqa: E402
from bench.trl_sides.reward_model import REWARD_SIDE, evaluate_reward_accuracy  # noqa: E402
from bench.trl_sides.sft import SFT_SIDE, evaluate_held_out_loss, split_rows  # noqa: E402
from tempax.eval.metrics import paired_difference_interval, paired_mean_difference_interval  # noqa: E402

# --tiny: the test kit's tiny-llama shape (one layer, the kit tokenizer's 400 ids), and 2 steps a row: of 2 pairs
# (4 rows) of 64 tokens for the pair rows (6 held-out pairs), of 2 packed 64-token rows for SFT (6 of its 20
# dialogues held out).
TINY_MODEL = {"vocab_size": 400, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "num_kv_heads": 1,
              "head_dim": 16, "intermediate_size": 64}
_TINY_PAIRS = ("train.steps=2", "train.batch_size=4", "train.seq_len=64", "data.max_rows=8", "data.max_eval_rows=6",
               "train.optimizer.warmup_steps=0")
_TINY_SFT = ("train.steps=2", "train.batch_size=2", "train.seq_len=64", "data.max_rows=20", "data.eval_fraction=0.3",
             "train.optimizer.warmup_steps=0")


@dataclass(frozen=True)
class PeerRow:
    """A learning-table row run by both libraries: tempax's `COMMAND --config RECIPE` (plus `tempax_only`, which
    switches off the run's own held-out evaluation), TRL's side (`trl`; None: not built, the row prints "not
    run"), and the metric both final models are scored by (`evaluate(cfg, base, row_dir)` -> per-item values of
    "before", "tempax" and "trl"; `kind` "proportion" for right / wrong items, "loss" for per-item losses)."""

    name: str
    command: str
    recipe: str
    overrides: tuple[str, ...] = ()
    tiny: tuple[str, ...] = _TINY_PAIRS
    trl: TrlSide | None = None
    metric: str = ""
    kind: str = "proportion"
    evaluate: Callable[[Any, str, str], dict[str, list]] | None = None
    tie_before: bool = False  # implicit rewards: before training every pair is a tie
    tempax_only: tuple[str, ...] = ("eval.before=false", "data.eval_path=null")
    export_adapters: bool = True  # tempax's adapters are exported for the evaluation (else its run saved a model)
    setup: Callable[[Any, str], list[str]] | None = None  # (cfg, row_dir) -> overrides both sides then get
    missing: str = ""  # why the row has no TRL side yet
    # The per-step training curve of the last column: (its name, tempax's metrics.jsonl key, TRL's log key).
    # "loss" shows that the two runs are one run; GRPO's loss is 0 at every step (beta 0, one pass), so its row
    # shows the mean sampled reward instead.
    curve: tuple[str, str, str] = ("loss", "loss", "loss")


# Preference rows score 200 held-out hh-rlhf pairs, as in bench/learning.py.
_PAIRS = ("data.max_eval_rows=200",)
# The GSM8K GRPO recipe turned into the demo's GRPO stage: the arithmetic task, format + correctness weighted
# alike, 10 steps of 2 prompts x 8 completions of up to 48 tokens at a constant LoRA lr 2e-4, the whole batch in
# one pass (the demo's loop settings), the answers of 200 held-out problems.
_GRPO = ("task.name=arithmetic", "task.source=null", "task.num_train_problems=2000", "rewards.weights=null",
         "grpo.max_new_tokens=48", "grpo.max_prompt_len=512", "grpo.show_completion_every=0", "eval.num_problems=200",
         "eval.max_new_tokens=48",
         "train.steps=10", "train.micro_batch_size=null", "train.remat=null", "train.optimizer.learning_rate=2e-4",
         "train.optimizer.warmup_steps=0", "train.optimizer.grad_clip_norm=1.0", "train.checkpoint.every=0")
_TINY_GRPO = ("train.steps=2", "train.batch_size=1", "grpo.group_size=2", "grpo.max_new_tokens=8",
              "eval.num_problems=6", "eval.max_new_tokens=8", "task.num_train_problems=40")

ROWS = (
    # 200 held-out dialogues (the recipe's 2% of 2000 would give 40): enough for a paired interval.
    PeerRow("SFT", "sft", "recipes/sft_lora_smollm2.yaml", ("data.eval_fraction=0.1",), tiny=_TINY_SFT,
            trl=SFT_SIDE, metric="held-out loss (nats)", kind="loss", evaluate=evaluate_held_out_loss,
            tempax_only=(), setup=split_rows),
    PeerRow("DPO", "dpo", "recipes/dpo_smollm2_lora.yaml", _PAIRS, trl=DPO_SIDE, metric="preference accuracy",
            evaluate=evaluate_implicit_rewards, tie_before=True),
    PeerRow("KTO", "kto", "recipes/kto_smollm2_lora.yaml", _PAIRS, trl=KTO_SIDE, metric="preference accuracy",
            evaluate=evaluate_implicit_rewards, tie_before=True),
    PeerRow("reward model", "reward-model", "recipes/reward_model_smollm2_lora.yaml", _PAIRS, trl=REWARD_SIDE,
            metric="reward accuracy", evaluate=evaluate_reward_accuracy, export_adapters=False),
    # The demo's GRPO stage (`tempax.experiments.demo.demo_grpo_config`; a test checks the two agree) from the demo's
    # SFT warm-start, scored on 200 held-out problems.
    PeerRow("GRPO, arithmetic", "grpo", "recipes/grpo_gsm8k_smollm2.yaml", _GRPO, tiny=_TINY_GRPO, trl=GRPO_SIDE,
            metric="answer accuracy", evaluate=evaluate_answers, tempax_only=("eval.before=false", "eval.after=false"),
            setup=warm_start, curve=("reward", "reward/total_mean", "reward")),
)


# ------------------------------------------------------------------------------------------------ the shared base


def write_base(folder: str, *, tiny: bool) -> str:
    """The starting Hugging Face folder both sides train from (`tempax export`'s writer)."""
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    if tiny:
        from flax import nnx

        from tempax.models.decoder import Decoder
        from tempax.models.hf_io import save_hf_checkpoint
        from tempax.models.presets import PRESETS
        from tests.kit.tokenizers import tiny_chat_tokenizer

        model = Decoder(PRESETS["tiny-llama"].replace(**TINY_MODEL), rngs=nnx.Rngs(0))
        save_hf_checkpoint(model, folder, tokenizer=tiny_chat_tokenizer())
        return folder
    subprocess.run([sys.executable, "-m", "tempax.cli.main", "export", "smollm2-135m-instruct", folder], cwd=REPO,
                   check=True, env=_env())
    return folder


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}


def _overrides(row: PeerRow, base: str, tiny: bool, extra: tuple[str, ...]) -> list[str]:
    """Both sides' overrides of one row: the base first, then the row's, the smoke mode's and the command line's.
    A command-line override `COMMANDS:key=value` applies to the rows of those commands only (e.g.
    `sft:data.path=DIALOGUES` or `dpo,kto,reward-model:data.path=PAIRS`)."""
    mine = []
    for override in extra:
        scope, _, rest = override.partition(":")
        if not rest or "=" in scope:  # unscoped (a value may hold a colon: a path, a time)
            mine.append(override)
        elif row.command in scope.split(","):
            mine.append(rest)
    return [f"model.source={base}", "train.progress_bar=false", *row.overrides, *(row.tiny if tiny else ()), *mine]


def _config_class(command: str) -> Any:
    from tempax.algorithms.grpo.config import GRPOConfig
    from tempax.algorithms.preference.dpo import DPOConfig
    from tempax.algorithms.preference.kto import KTOConfig
    from tempax.algorithms.preference.reward import RewardModelConfig
    from tempax.algorithms.sft.main import SFTConfig

    return {"dpo": DPOConfig, "kto": KTOConfig, "reward-model": RewardModelConfig, "sft": SFTConfig,
            "grpo": GRPOConfig}[command]


def load_row_config(row: PeerRow, overrides: list[str]) -> Any:
    from tempax.configlib import load_config

    return load_config(_config_class(row.command), os.path.join(REPO, row.recipe), overrides, command=row.command)


SETUP_FILE = "overrides.json"  # OUT/ROW/overrides.json: what `PeerRow.setup` added to both sides' overrides


def prepare_row(row: PeerRow, overrides: list[str], row_dir: str) -> list[str]:
    """The preparation child: the row's setup (SFT: the rows split once), then TRL's inputs (tempax's tokens in
    tempax's order, its arguments and initial weights) in ROW/trl. Returns the overrides both sides train with."""
    added = row.setup(load_row_config(row, overrides), row_dir) if row.setup else []
    with open(os.path.join(row_dir, SETUP_FILE), "w") as f:
        json.dump(added, f)
    overrides = [*overrides, *added]
    write_inputs(row.trl, load_row_config(row, overrides), _base_of(overrides), os.path.join(row_dir, "trl"))
    return overrides


def _with_setup(row_dir: str, overrides: list[str]) -> list[str]:
    try:
        with open(os.path.join(row_dir, SETUP_FILE)) as f:
            return [*overrides, *json.load(f)]
    except OSError:
        return overrides


# ------------------------------------------------------------------------------------------------ evaluation


def evaluate_row(row: PeerRow, row_dir: str, overrides: list[str]) -> dict[str, Any]:
    """The row's per-item values before and for each side's final model, and both sides' training losses."""
    result = row.evaluate(load_row_config(row, overrides), _base_of(overrides), row_dir)
    result["train_" + row.curve[0]] = training_losses(row_dir, row.curve[1:])
    return result


def training_losses(row_dir: str, keys: tuple[str, str] = ("loss", "loss")) -> dict[str, list[float]]:
    """Each side's training loss per step (`keys`: another per-step value of tempax's metrics and of TRL's log):
    tempax's metrics.jsonl, TRL's log history (same start, same rows and the same optimiser: the first losses agree
    to float rounding, a check that the two runs are the same run)."""
    ours, theirs = keys
    losses: dict[str, list[float]] = {}
    try:
        with open(os.path.join(row_dir, "tempax", "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        losses["tempax"] = [float(r[ours]) for r in records if ours in r and "step" in r]
    except OSError:
        pass
    try:
        with open(os.path.join(row_dir, "trl", "log_history.json")) as f:
            losses["trl"] = [float(r[theirs]) for r in json.load(f) if theirs in r]
    except OSError:
        pass
    return losses


# ------------------------------------------------------------------------------------------------ running a row


def _timed(cmd: list[str], log_path: str) -> tuple[int, float, float]:
    """(exit status, wall s, CPU s: user + system of the child) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        code = subprocess.run(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return code, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_row(row: PeerRow, out: str, base: str, tiny: bool, extra: tuple[str, ...]) -> None:
    """Prepares the row, trains both sides of it in child processes, exports tempax's adapter, evaluates both."""
    row_dir = os.path.join(out, row_slug(row))
    # A fresh folder: tempax's run would resume from a checkpoint left there, and a stale outcomes.json would be
    # printed as this run's.
    shutil.rmtree(row_dir, ignore_errors=True)
    os.makedirs(row_dir)
    overrides = _overrides(row, base, tiny, extra)
    me = os.path.abspath(__file__)
    if _timed([sys.executable, me, "--prepare", row.name, "--run", row_dir, "--", *overrides],
              os.path.join(row_dir, "prepare.log"))[0]:
        print(f"{row.name}: preparing the row failed, see {row_dir}/prepare.log", file=sys.stderr)
        return
    overrides = _with_setup(row_dir, overrides)
    for side in SIDES:
        side_dir = os.path.join(row_dir, side)
        if side == "tempax":  # scored by the evaluation child below, not by the training run itself
            cmd = [sys.executable, "-m", "tempax.cli.main", row.command, "--config", row.recipe,
                   f"train.run_dir={side_dir}", *overrides, *row.tempax_only]
        else:
            cmd = [sys.executable, me, "--side", "trl", "--row", row.name, "--run", side_dir, "--", *overrides]
        code, wall, cpu = _timed(cmd, side_dir + ".log")
        if code == 0 and side == "tempax" and row.export_adapters:
            code = subprocess.run([sys.executable, "-m", "tempax.cli.main", "export", side_dir,
                                   os.path.join(side_dir, "adapters"), "--adapters"], cwd=REPO, env=_env(),
                                  capture_output=True).returncode
        with open(side_dir + ".budget.json", "w") as f:
            json.dump({"wall_s": wall, "cpu_s": cpu, "exit": code}, f)
    code, _, _ = _timed([sys.executable, me, "--evaluate", row.name, "--run", row_dir, "--", *overrides],
                        os.path.join(row_dir, "evaluate.log"))
    if code:
        print(f"{row.name}: evaluation failed, see {row_dir}/evaluate.log", file=sys.stderr)


def row_slug(row: PeerRow) -> str:
    return row.name.split(",")[0].replace(" ", "_")


# ------------------------------------------------------------------------------------------------ the table


def versions() -> str:
    """The library versions of both sides."""
    names = ("tempax", "jax", "flax", "trl", "transformers", "torch", "peft")
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return ", ".join(found)


def _budget_of(row_dir: str, side: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(row_dir, side + ".budget.json")) as f:
            return json.load(f)
    except OSError:
        return None


def _seconds(spent: dict[str, Any] | None) -> str:
    return f"{spent['wall_s']:.0f} / {spent['cpu_s']:.0f}" if spent else "-"


def _learning() -> Any:
    """bench/learning.py, the learning table's formatting and CPU name; imported when a table is printed only,
    since it imports tempax's CLI (and JAX), which the TRL child must not: its process time is TRL's own."""
    import bench.learning

    return bench.learning


def _mean_loss(values: list[float]) -> str:
    return f"{sum(values) / len(values):.4f} of {len(values)}"


# Per-example losses that differ by less than this (nats) are the same model: float32 summation order alone moves
# a mean token loss by ~1e-6, and a paired t interval of such gaps can exclude 0 without meaning anything.
SAME_LOSS_NATS = 1e-4


def _loss_difference(ours: list[float], theirs: list[float]) -> str:
    """tempax - TRL of the per-item losses with the paired t interval; lower is better. When no item differs by
    SAME_LOSS_NATS the verdict says so, with the largest gap, instead of a side."""
    d = paired_mean_difference_interval(ours, theirs)
    largest = max(abs(a - b) for a, b in zip(ours, theirs))
    if largest < SAME_LOSS_NATS:
        verdict = f"the same to float rounding: no example differs by more than {largest:.1e}"
    else:
        verdict = "tempax lower" if d.high < 0 else ("TRL lower" if d.low > 0 else "inside its interval")
    return f"{d.difference:+.4f} [{d.low:+.4f}, {d.high:+.4f}] nats ({verdict}), paired t"


def _cell(row: PeerRow, outcomes: dict[str, Any], side: str) -> str:
    """One side's cell: before -> after of the row's metric."""
    before, after = outcomes.get("before"), outcomes[side]
    if row.kind == "loss":
        return f"{_mean_loss(before)} -> {_mean_loss(after)}"
    percent = _learning()._percent
    shown = "a tie" if row.tie_before else percent((sum(before), len(before)))
    return f"{shown} -> {percent((sum(after), len(after)))}"


def _first_last(losses: list[float] | None) -> str:
    return f"{losses[0]:.6f} .. {losses[-1]:.4f}" if losses else "-"


def table_line(row: PeerRow, out: str, label: str = "") -> str:
    """One Markdown line: the row's before -> after for both sides, tempax - TRL, both budgets, both losses
    (`label`: added to the row's name, e.g. the run's folder when a table shows several runs of a row)."""
    row_dir = os.path.join(out, row_slug(row))
    name = f"{row.name} ({label})" if label else row.name
    if row.trl is None:
        return f"| {name} | not run ({row.missing}) | - | - | - | - | - |"
    try:
        with open(os.path.join(row_dir, "outcomes.json")) as f:
            outcomes = json.load(f)
    except OSError:
        return f"| {name} | not run | - | - | - | - | - |"
    budgets = {side: _budget_of(row_dir, side) for side in SIDES}
    cells = []
    for side in SIDES:
        spent = budgets[side]
        if side in outcomes:
            cells.append(_cell(row, outcomes, side))
        else:
            cells.append(f"failed (exit {spent['exit']})" if spent and spent.get("exit") else "not run")
    difference = "-"
    if "tempax" in outcomes and "trl" in outcomes:
        if row.kind == "loss":
            difference = _loss_difference(outcomes["tempax"], outcomes["trl"])
        else:
            d = paired_difference_interval(outcomes["tempax"], outcomes["trl"])
            difference = _learning()._points(d.difference, d.low, d.high) + ", paired"
    losses = outcomes.get("train_" + row.curve[0], {})
    first_last = " / ".join(_first_last(losses.get(side)) for side in SIDES)
    if row.curve[0] != "loss":
        first_last = f"{row.curve[0]}: " + " / ".join(
            f"{v[0]:.2f} .. {v[-1]:.2f}" if (v := losses.get(side)) else "-" for side in SIDES)
    return (f"| {name} | {row.metric}, tempax: {cells[0]} | TRL: {cells[1]} | {difference} | "
            f"{_seconds(budgets['tempax'])} | {_seconds(budgets['trl'])} | {first_last} |")


def table(rows: tuple[PeerRow, ...], out: str, cpu: str, more: tuple[str, ...] = ()) -> str:
    """The Markdown table of the runs in `out`, then the rows that ran in each folder of `more` (other runs of
    the same rows, e.g. with another `train.seed`), labelled with that folder's name."""
    lines = [f"tempax against TRL, same start, rows, order and budget ({cpu}; {versions()}; 95% intervals):", "",
             "| row | tempax: before -> after | TRL: before -> after | tempax - TRL, 95% interval | "
             "tempax wall / CPU s | TRL wall / CPU s | training loss first .. last, tempax / TRL |",
             "|---|---|---|---|---|---|---|"]
    lines += [table_line(row, out) for row in rows]
    for folder in more:
        lines += [table_line(row, folder, os.path.basename(folder.rstrip(os.sep))) for row in rows
                  if os.path.isfile(os.path.join(folder, row_slug(row), "outcomes.json"))]
    return "\n".join(lines)


def table_record(rows: tuple[PeerRow, ...], out: str, cpu: str, command: str,
                 more: tuple[str, ...] = (), notes: str = "") -> dict[str, Any]:
    """The table as a `bench/results.py` record (topic "learning"), the rows that were run only; `notes` (what the
    table shows, in words) go before the versions."""
    lines = table(rows, out, cpu, more).splitlines()
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]
    run = [row for row in cells[2:] if row[1] != "not run" and not row[1].startswith("not run (")]
    return {"kind": "table", "topic": "learning", "title": "tempax against TRL: same start, rows, order and budget",
            "columns": cells[0], "rows": run, "command": command, "cpu": cpu,
            "notes": f"{notes.rstrip('. ')}. {versions()}" if notes else versions()}


def selected(only: str | None) -> list[PeerRow]:
    if not only:
        return [r for r in ROWS if r.trl is not None]
    names = {n.strip().lower() for n in only.split(",")}
    return [r for r in ROWS if r.trl is not None and (r.name.lower() in names or r.command in names)]


def _base_of(overrides: list[str]) -> str:
    """The starting folder: the last `model.source=` override, the one tempax's run takes (every child gets the
    shared base first; a row's setup may add its own start, e.g. GRPO's warm-start)."""
    return [o for o in overrides if o.startswith("model.source=")][-1].split("=", 1)[1]


def _row_named(name: str) -> PeerRow:
    return next(r for r in ROWS if r.name == name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=("trl",), default="trl", help="the library compared with (TRL, pinned)")
    parser.add_argument("--only", default=None, help="comma-separated row names or commands (default: every row "
                        "whose TRL side exists)")
    parser.add_argument("--out", default="runs/learning_trl", help="where the runs go")
    parser.add_argument("--tiny", action="store_true", help="smoke mode: a tiny model, 2 steps a row")
    parser.add_argument("--table", default=None, metavar="OUT[,OUT...]", help="print the table of the runs in OUT, "
                        "run nothing; later folders add the rows that ran there (other runs, e.g. other seeds)")
    parser.add_argument("--command", default=None, help="with --record: the command(s) that made the runs, as the "
                        "record names them (default: this command's --only)")
    parser.add_argument("--record", default=None, metavar="FILE", help="also append the table, rows that ran, as a "
                        "bench/results.py record to FILE (e.g. bench/records/learning.jsonl)")
    parser.add_argument("--notes", default="", help="with --record: what the table shows, in words, on the page")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--evaluate", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prepare", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--row", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run", default=None, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="a.b=value overrides for both sides of every row, or "
                        "COMMANDS:a.b=value for some rows' (e.g. sft:data.path=FILE) (after --)")
    args = parser.parse_args(argv)
    if args.prepare:  # a child: the row's split, and tempax's tokens, order and initial weights for TRL's side
        prepare_row(_row_named(args.prepare), args.overrides, args.run)
        return 0
    if args.side == "trl":  # a child: TRL's side of one row (torch and TRL only)
        train_trl(_row_named(args.row).trl, _base_of(args.overrides), args.run)
        return 0
    if args.evaluate:  # a child: both final models of one row, scored by tempax
        outcomes = evaluate_row(_row_named(args.evaluate), args.run, args.overrides)
        with open(os.path.join(args.run, "outcomes.json"), "w") as f:
            json.dump(outcomes, f)
        return 0
    folders = [os.path.abspath(f) for f in (args.table or args.out).split(",")]  # children run in the repo root
    out, more = folders[0], tuple(folders[1:])
    if not args.table:
        os.makedirs(out, exist_ok=True)
        base = write_base(os.path.abspath(os.path.join(out, "base")), tiny=args.tiny)
        for row in selected(args.only):
            print(f"running {row.name}: tempax {row.command} and TRL", file=sys.stderr, flush=True)
            run_row(row, out, base, args.tiny, tuple(args.overrides))
    cpu = _learning().cpu_name()
    print(table(ROWS, out, cpu, more))
    if args.record:
        command = args.command or ("python bench/learning_trl.py --peer trl" + (f" --only {args.only}" if args.only
                                                                               else ""))
        with open(args.record, "a", encoding="utf-8") as f:
            f.write(json.dumps(table_record(ROWS, out, cpu, command, more, args.notes)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
