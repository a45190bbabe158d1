"""The skeleton every algorithm's `main` shares, `run_algorithm`, and the `Run` it works through.

    def plan(run: Run) -> Training:        # what differs: data, model, loss, batches (run.mesh, run.say, ...)
        model, tokenizer, trainable = build_model(cfg, run.mesh)
        ...
        return Training(Trainable(model), loss_fn, batches, algorithm="sft", trainable=trainable)

    trained = run_algorithm(cfg, plan, hooks=hooks, log=log)   # start_run, plan, Trainer, fit, held-out loss
    trained.run.done(trained.result)                          # then what differs after training

`run_algorithm` starts the run (`start_run`), calls the algorithm's `plan`, builds the one `Trainer` on the run's
mesh with the checkpoint metadata every run records, lets the plan check the trainer (`Training.ready`), trains
with `Run.train` and returns the run, the trainer and the result. On-policy algorithms that evaluate by
generating on held-out problems (GRPO, RFT) finish with `finish_policy` (evaluation after training, the
before/after table, the adapters).

The `Run`'s pieces are also usable on their own:

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

`start_run` takes the run dir's lock (`tempax.train.run_identity.hold_run_dir`: one run per run dir; a second
process gets one line naming the holder and exits 2 before anything is loaded) and `train` gives it back when the
trainer is closed; `hold_run(cfg)` holds it around a whole command (the CLI's), so it covers the reports after
training too. In a multi-process run process 0 takes it and the others wait for process 0 at a barrier.

Across processes (`tempax launch`, clusters) `start_run` first joins the run (`train.mesh.join()`, before
anything starts JAX's backend), and every file here is written by process 0 alone (`is_writer`); the other
processes run the same code and compute the same values, so paths and tables are the same everywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

from flax import nnx

from tempax.data.sft import SFTData
from tempax.data.tasks.spec import load_task
from tempax.errors import ConfigError
from tempax.eval.evaluate import evaluate, format_table
from tempax.models.lora import merge_lora, save_adapters
from tempax.parallel.process import is_writer, sync
from tempax.rl.rollout import encode_prompts
from tempax.train.loop import Trainer, TrainResult
from tempax.train.metrics import MetricsWriter
from tempax.train.step import LossFn
from tempax.train.run_identity import CONFIG_FILE, acquire_run_dir, release_run_dir, save_run_config
from tempax.train.storage import write_atomic

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
    locked: bool = False  # this Run holds one count of the run dir's lock (given back by `close`)
    _mesh: Any = None

    @property
    def mesh(self) -> Any:
        """The run's device mesh (`train.mesh`), built on first use."""
        if self._mesh is None:
            self._mesh = self.config.train.mesh.build()
        return self._mesh

    def close(self) -> None:
        """Gives back the run dir's lock taken by `start_run` (idempotent)."""
        if self.locked:
            self.locked = False
            release_run_dir(self.run_dir)

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def write_json(self, name: str, data: Any) -> str:
        path = self.path(name)
        if is_writer():
            write_atomic(path, json.dumps(data, indent=2, default=str))
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
            self.close()
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

    def save_adapters(self, policy: Any) -> None:
        """A LoRA run's adapters in `<run_dir>/adapters` (PEFT layout); nothing for full weights."""
        if self.config.lora is not None:
            self.files["adapters"] = save_adapters(policy, self.path("adapters"),
                                                   base_model_name_or_path=self.config.model.source)


@dataclass
class Training:
    """What an algorithm's `plan` gives `run_algorithm`: the parts of a run that differ between algorithms.

    Attributes:
      model: the module to train (adapters applied), or a `tempax.train.trainable.TrainableModel` (a composite,
        or `Trainable(model, ...)` with what the run adds to the memory plan).
      loss_fn: `loss_fn(model, batch) -> (loss, metrics)`.
      batches: the batch source `Trainer.fit` reads.
      algorithm: the name the checkpoints record.
      trainable: the NNX filter of the trained parameters (`build_model`'s third value).
      hooks: the algorithm's own hooks (run before the caller's).
      eval_batches: held-out batches scored with the loss before (when `evaluate_before`) and after training.
      eval_loss_fn: the loss held-out batches are scored with (None: `loss_fn`).
      evaluate_before: score `eval_batches` before the first step too.
      checkpoint_meta: what else the checkpoints record (the config's `model.source` is always recorded).
      ready: called with the trainer before training (a check of its micro-batching, a source that samples from
        its weights before the first step).
      kept: what the algorithm's `main` reads after training (its source, held-out rows, ...), in `Trained.kept`.
    """

    model: Any
    loss_fn: LossFn
    batches: Any
    algorithm: str
    trainable: Any = nnx.Param
    hooks: Sequence[Any] = ()
    eval_batches: Callable[[], Iterable[dict[str, Any]]] | None = None
    eval_loss_fn: LossFn | None = None
    evaluate_before: bool = False
    checkpoint_meta: dict[str, Any] = field(default_factory=dict)
    ready: Callable[[Trainer], None] | None = None
    kept: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trained:
    """What `run_algorithm` returns: the run, its (closed) trainer, the training result and `Training.kept`."""

    run: Run
    trainer: Trainer
    result: TrainResult
    kept: dict[str, Any] = field(default_factory=dict)


def run_algorithm(
    cfg: Any, plan: Callable[[Run], Training], *, hooks: Sequence[Any] = (), log: Callable[[str], None] | None = None
) -> Trained:
    """The shared skeleton of a training command (see the module docstring): `start_run`, `plan(run)`, the
    `Trainer`, `ready(trainer)`, `Run.train`."""
    run = start_run(cfg, log=log)
    training = plan(run)
    trainer = make_trainer(cfg, training, mesh=run.mesh, log=run.say)
    try:
        result = run.train(trainer, training.batches, hooks=[*training.hooks, *hooks],
                           eval_batches=training.eval_batches, evaluate_before=training.evaluate_before)
    finally:
        close = getattr(training.batches, "close", None)  # a source holding processes (GRPO's rollout workers)
        if callable(close):
            close()
    return Trained(run, trainer, result, training.kept)


def make_trainer(cfg: Any, training: Training, *, mesh: Any, log: Callable[[str], None]) -> Trainer:
    """The `Trainer` of `training` (`run_algorithm`'s, or a `prepare` function's that returns a run ready to
    train): the checkpoints record the algorithm and the config's `model.source`; `training.ready` checks it."""
    source = getattr(getattr(cfg, "model", None), "source", None)
    meta = {"algorithm": training.algorithm, **({"model_source": source} if source else {}),
            **training.checkpoint_meta}
    trainer = Trainer(training.model, training.loss_fn, cfg.train, trainable=training.trainable, mesh=mesh, log=log,
                      eval_loss_fn=training.eval_loss_fn, checkpoint_meta=meta)
    training.model = None  # the trainer holds the weights now; keep no second set alive during training
    if training.ready is not None:
        training.ready(trainer)
    return trainer


@dataclass
class PolicyRun:
    """What an algorithm evaluated by generating on held-out problems returns (GRPO, RFT): the training result,
    the evaluations before and after, the batch source and the trained policy."""

    result: TrainResult
    source: Any
    policy: Any
    before: Any = None
    after: Any = None
    files: dict[str, str] = field(default_factory=dict)


def task_prompts(run: Run, tokenizer: Any, *, max_prompt_len: int, section: str, what: str = "prompts",
                 env_factory: Any = None) -> tuple[list[Any], list[dict[str, Any]]]:
    """(encoded training prompts, held-out rows) of the config's `task` (`eval.num_problems` held out); prompts
    longer than `max_prompt_len` tokens are dropped and counted in the line it prints. With `env_factory` the
    prompts are a fresh environment's first messages (`encode_prompts`); a task none of whose prompts fit is
    refused."""
    cfg = run.config
    train_rows, held_rows = load_task(cfg.task, eval_problems=cfg.eval.num_problems)
    prompts, dropped = encode_prompts(tokenizer, train_rows, max_prompt_len=max_prompt_len, env_factory=env_factory)
    run.say(f"task {cfg.task.name}: {len(prompts)} training {what} ({dropped} longer than {section}.max_prompt_len="
            f"{max_prompt_len} dropped), {len(held_rows)} held-out problems")
    if not prompts:
        raise ConfigError(f"every training prompt is longer than {section}.max_prompt_len={max_prompt_len} tokens; "
                          "raise it")
    return prompts, held_rows


def evaluate_before(run: Run, model: Any, tokenizer: Any, held_rows: Sequence[dict[str, Any]], options: Any, *,
                    evaluate_fn: Callable[..., Any] | None = None) -> Any:
    """The held-out evaluation before training (of the model before its zero-initialised adapters go on), or None
    when there are no held-out problems or `eval.before` is off. `evaluate_fn`: in place of
    `tempax.eval.evaluate.evaluate`, with its signature (a run that plays episodes evaluates episodes)."""
    if not held_rows or not run.config.eval.before:
        return None
    before = (evaluate_fn or evaluate)(model, tokenizer, held_rows, options, label="eval before")
    run.say(f"before training: {before.summary_line()}")
    return before


def finish_policy(trained: Trained) -> PolicyRun:
    """After training a policy: the held-out evaluation (`eval.after`), the before/after table (eval.json and
    metrics.jsonl), the adapters of a LoRA run and why the run stopped early, if it did. `trained.kept` holds
    `source`, `tokenizer`, `held_rows`, `options` (`tempax.eval.spec.eval_options`) and `before`, and may hold
    `evaluate`, the evaluation function (`evaluate_before`'s `evaluate_fn`)."""
    run, result = trained.run, trained.result
    cfg = run.config
    source, tokenizer, held_rows, options, before = (
        trained.kept[k] for k in ("source", "tokenizer", "held_rows", "options", "before"))
    policy = trained.trainer.model
    out = PolicyRun(result=result, source=source, policy=policy, before=before, files=run.files)
    if held_rows and cfg.eval.after:
        # Adapters folded in: the same function, without the extra adapter matmuls per generated token.
        evaluate_fn = trained.kept.get("evaluate") or evaluate
        out.after = evaluate_fn(merge_lora(policy) if cfg.lora is not None else policy, tokenizer, held_rows, options,
                                label="eval after")
        run.say(f"after training: {out.after.summary_line()}")
    stages = [(name, r) for name, r in (("before", before), ("after", out.after)) if r is not None]
    if stages:
        last = result.history[-1][0] if result.history else 0
        run.report_stages(stages, table=format_table(stages), file="eval.json", steps={"before": 0, "after": last})
    run.save_adapters(policy)
    if result.stop_reason:
        run.say(f"stopped early: {result.stop_reason}")
    return out


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
    _lock(run.run_dir)
    run.locked = is_writer()
    try:
        if is_writer():  # process 0 checks a resume's config and writes config.yaml
            save_run_config(run.run_dir, cfg, say=run.say)
    except BaseException:
        run.close()
        raise
    run.files["config"] = run.path(CONFIG_FILE)
    return run


def _lock(run_dir: str) -> None:
    """Process 0 takes the run dir's lock; the others wait for it at a barrier (a failure there ends process 0,
    and with it the run)."""
    if is_writer():
        acquire_run_dir(run_dir)
    sync("tempax-run-dir-lock")


@contextlib.contextmanager
def hold_run(cfg: Any) -> Iterator[None]:
    """The run dir's lock around a whole command (joins a multi-process run first; see the module docstring)."""
    cfg.train.mesh.join()
    _lock(cfg.train.run_dir)
    try:
        yield
    finally:
        if is_writer():  # the outermost holder: also what a `start_run` that failed before `train` still held
            release_run_dir(cfg.train.run_dir, every=True)


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
