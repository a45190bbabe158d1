"""One way to set up a run, shared by every algorithm's `main` (SFT, pre-training, DPO, reward models, GRPO).

    run = start_run(cfg, log=log)         # run_dir made, config.yaml written (the only place that writes it)
    run.save_tokenizer(tokenizer)
    result = run.train(trainer, batches, hooks=hooks, eval_batches=held_out, evaluate_before=cfg.eval_before)
    run.report_held_out(result, title="held-out pairs (64), sigmoid loss:", extra={"loss": "sigmoid"})

`train` is `Trainer.fit` with the held-out evaluation around it: the loss function's metrics on the held-out
batches before the first step (when asked) and at the end of the run (`fit`'s eval hook), in
`result.extras["eval_before"]` / `["eval_after"]`; the trainer is closed afterwards. `report_held_out` prints
the before/after table and writes `eval_summary.json`. Generation-based evaluations (GRPO's accuracy on held-out
problems) are stages: `report_stages` prints their table, writes them to a JSON file and into metrics.jsonl.

`start_run` is where a run's config meets its directory: a run dir with checkpoints is a resume, and its new
config is checked against the saved config.yaml before that is replaced (`tempax.train.run_identity`: differences
that change the trajectory are refused unless `train.allow_config_change=true`, and every accepted one is
recorded with its step in config_changes.jsonl).

Across processes (`tempax launch`, clusters) `start_run` first joins the run (`train.mesh.join()`, before
anything starts JAX's backend), and every file here is written by process 0 alone (`is_writer`); the other
processes run the same code and compute the same values, so paths and tables are the same everywhere.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from tempax.data.sft import SFTData
from tempax.parallel.process import is_writer
from tempax.train.loop import Trainer, TrainResult
from tempax.train.run_identity import CONFIG_FILE, save_run_config
EVAL_SUMMARY_FILE = "eval_summary.json"

# Held-out metrics shown first in a before/after table (others the loss reports follow, sorted).
BEFORE_AFTER_KEYS = ("accuracy", "mean_logp_accuracy", "reward_margin", "chosen_reward", "rejected_reward",
                     "chosen_logps", "rejected_logps", "loss")


def stderr_logger(text: str) -> None:
    print(text, file=sys.stderr)


@dataclass
class Run:
    """A started run: its config, directory, logger and the files written so far (name -> path)."""

    config: Any
    run_dir: str
    say: Callable[[str], None]
    files: dict[str, str] = field(default_factory=dict)

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def write_json(self, name: str, data: Any) -> str:
        path = self.path(name)
        if is_writer():
            with open(path, "w") as f:
                json.dump(data, f, indent=2, default=str)
        self.files[name.rsplit(".", 1)[0]] = path
        return path

    def save_tokenizer(self, tokenizer: Any) -> str:
        """The tokenizer in `<run_dir>/tokenizer` (export and evaluation load it from there)."""
        folder = self.path("tokenizer")
        if is_writer() and not os.path.isdir(folder):
            tokenizer.hf.save_pretrained(folder)
        return folder

    def train(
        self,
        trainer: Trainer,
        batches: Iterable[dict[str, Any]],
        *,
        hooks: Sequence[Any] = (),
        eval_batches: Callable[[], Iterable[dict[str, Any]]] | None = None,
        evaluate_before: bool = False,
    ) -> TrainResult:
        """`trainer.fit` with the held-out loss metrics before (when asked) and after; closes the trainer."""
        before = None
        try:
            if eval_batches is not None and evaluate_before:
                before = trainer.evaluate(eval_batches(), max_batches=trainer.config.eval_batches)
                self.say("before training, held out: " + brief(before))
            result = trainer.fit(batches, hooks=hooks, eval_batches=eval_batches)
        finally:
            trainer.close()
        after = result.eval_history[-1][1] if result.eval_history else None
        result.extras.update(eval_before=before, eval_after=after)
        return result

    def report_held_out(self, result: TrainResult, *, title: str, extra: dict[str, Any] | None = None) -> str:
        """Prints the before/after table of `train`'s held-out metrics and writes eval_summary.json."""
        before, after = result.extras.get("eval_before"), result.extras.get("eval_after")
        if before is not None and after is not None:
            self.say(before_after_table(before, after, title=title))
        elif after is not None:
            self.say("after training, held out: " + brief(after))
        return self.write_json(EVAL_SUMMARY_FILE, {"before": before, "after": after, **(extra or {})})

    def report_stages(self, stages: Sequence[tuple[str, Any]], *, table: str, file: str,
                      steps: dict[str, int]) -> None:
        """Generation-based evaluations (name -> an object with `to_dict()` and `metrics(prefix)`): prints the
        table, writes `<run_dir>/<file>` and each stage's `eval/*` metrics into metrics.jsonl at `steps[name]`."""
        from tempax.train.metrics import MetricsWriter

        self.say("\n" + table)
        self.write_json(file, {name: r.to_dict() for name, r in stages})
        if not is_writer():
            return
        train = self.config.train
        writer = MetricsWriter(self.run_dir, report_to=train.trackers, run_name=train.run_name)
        try:
            for name, r in stages:
                writer.write(steps.get(name, 0), r.metrics("eval/"))
        finally:
            writer.close()


def write_run_files(run: Run, data: SFTData, tokenizer: Any) -> None:
    """Reports the data and writes data_report.json and the tokenizer into the run dir (`start_run` wrote
    config.yaml): SFT's and distillation's mains, which read their data the same way (`tempax.data.sft`)."""
    run.say(data.report.summary())
    for where, reason, detail in data.report.bad_rows[:5]:
        run.say(f"  skipped {where}: {reason}" + (f" ({detail})" if detail else ""))
    run.write_json("data_report.json", data.report.to_dict())
    run.save_tokenizer(tokenizer)


def start_run(cfg: Any, *, log: Callable[[str], None] | None = None) -> Run:
    """Makes `cfg.train.run_dir` and writes the resolved config to `<run_dir>/config.yaml` (see the module
    docstring; raises `ConfigError` listing the differences when a resume would change the trajectory); `log` is
    where the run's messages go (default stderr)."""
    cfg.train.mesh.join()  # a multi-process run is joined before anything can start JAX's backend
    run = Run(cfg, cfg.train.run_dir, log or stderr_logger)
    if is_writer():  # process 0 checks a resume's config and writes config.yaml
        save_run_config(run.run_dir, cfg, say=run.say)
    run.files["config"] = run.path(CONFIG_FILE)
    return run


def brief(metrics: dict[str, float]) -> str:
    """The headline held-out numbers of a metrics dict, e.g. 'accuracy 0.6406, reward_margin 0.0580, loss 0.6700'."""
    keys = [k for k in ("accuracy", "reward_margin", "loss") if k in metrics]
    return ", ".join(f"{k} {metrics[k]:.4f}" for k in keys)


def before_after_table(before: dict[str, float], after: dict[str, float], *, title: str) -> str:
    """A small text table of held-out metrics before and after training."""
    keys = [k for k in BEFORE_AFTER_KEYS if k in before or k in after]
    keys += sorted(k for k in after if k not in keys and k in before)
    lines = [title, f"  {'metric':<20}{'before':>12}{'after':>12}{'change':>12}"]
    for k in keys:
        b, a = before.get(k, float("nan")), after.get(k, float("nan"))
        lines.append(f"  {k:<20}{b:>12.4f}{a:>12.4f}{a - b:>+12.4f}")
    return "\n".join(lines)
