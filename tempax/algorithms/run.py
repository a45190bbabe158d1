"""The steps every algorithm's `main` takes, as small functions it calls in order: start the run, build the
trainer, train, finish.

    def main(cfg: MyConfig, *, hooks: tuple = (), log=None) -> RunResult:
        run = start_run(cfg, log=log)                              # run dir, config.yaml, the resume check, the lock
        model, tokenizer, trainable = build_model(cfg, run.mesh)   # tempax.algorithms.common: source + LoRA
        data = build_data(cfg.data, tokenizer, ...)                # what differs: data, loss, batch source
        write_run_files(run, data, tokenizer)
        trainer = make_trainer(cfg, model, my_loss, algorithm="myalgo", trainable=trainable, mesh=run.mesh,
                               log=run.say)
        del model                                                  # the trainer holds the weights now
        result = run.train(trainer, data.train, hooks=hooks, eval_batches=data.eval_loader)   # Trainer.fit
        return result                                              # finish: what the algorithm saves and reports

Every `main` returns a `RunResult`. Across processes (`tempax launch`, clusters) every file here is written by
process 0 alone (`is_writer`); the other processes run the same code and compute the same values, so paths and
tables are the same everywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

from flax import nnx

from tempax.algorithms.registry import command_of
from tempax.data.sft import SFTData
from tempax.data.tasks.spec import load_task
from tempax.errors import ConfigError
from tempax.eval.evaluate import evaluate, format_table
from tempax.models.lora import merge_lora, peft_unsupported_reason, save_adapters
from tempax.parallel.process import is_writer, sync
from tempax.rl.rollout import encode_prompts
from tempax.train.loop import Trainer, TrainResult
from tempax.train.metrics import MetricsWriter
from tempax.train.step import LossFn
from tempax.train.run_identity import CONFIG_FILE, acquire_run_dir, release_run_dir, save_run_config
from tempax.train.storage import write_atomic

EVAL_SUMMARY_FILE = "eval_summary.json"


@dataclass
class RunResult(TrainResult):
    """What every algorithm's `main` returns: `Trainer.fit`'s `TrainResult` (the logged history, the held-out
    loss metrics, the stop reason, the algorithm's `extras`) and what the run made beside it.

    Attributes (beyond `TrainResult`'s):
      model: the trained model as the trainer holds it (adapters not merged): the policy, the reward model, a
        distillation's student and teacher pair, PPO's actor-critic.
      source: the batch source it trained from (on-policy runs: their rollouts and metrics).
      before, after: the generation-based evaluations before and after training (GRPO and RFT: a
        `TaskEvaluation`, PPO: a `PolicyEval`), None where the run makes none or was told not to.
      files: what the run wrote into its run dir (name -> path).
    """

    model: Any = None
    source: Any = None
    before: Any = None
    after: Any = None
    files: dict[str, str] = field(default_factory=dict)

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
    ) -> RunResult:
        """`trainer.fit` with the held-out evaluation around it; closes the trainer. The result holds the trained
        model, the batch source and the run's files.

        The loss function's metrics on the held-out batches are taken before the first step (when
        `evaluate_before`) and at the end of the run (`fit`'s eval hook), in `result.extras["eval_before"]` /
        `["eval_after"]`; the trainer is closed afterwards and the run dir's lock given back."""
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
        fitted = {f.name: getattr(result, f.name) for f in dataclasses.fields(TrainResult)}
        return RunResult(**fitted, model=trainer.model, source=batches, files=self.files)

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
        if self.config.lora is None:
            return
        reason = peft_unsupported_reason(policy)
        if reason is not None:  # the checkpoints still hold the adapters; export merges them
            self.say(f"adapters not written in PEFT's layout: {reason}")
            return
        self.files["adapters"] = save_adapters(policy, self.path("adapters"),
                                               base_model_name_or_path=self.config.model.source)


# -- start the run -------------------------------------------------------------------------------------------


def start_run(cfg: Any, *, log: Callable[[str], None] | None = None) -> Run:
    """Makes `cfg.train.run_dir` and writes the resolved config to `<run_dir>/config.yaml`, as a recipe of the
    command whose record names the config's class; `log` is where the run's messages go (default stderr).

    This is where a run's config meets its directory: a run dir with checkpoints is a resume, and its new config is
    checked against the saved config.yaml before that is replaced (`tempax.train.run_identity`: differences that
    change the trajectory are refused with a `ConfigError` listing them unless `train.allow_config_change=true`,
    and every accepted one is recorded with its step in config_changes.jsonl).

    It takes the run dir's lock (`tempax.train.run_identity.hold_run_dir`: one run per run dir; a second process
    gets one line naming the holder and exits 2 before anything is loaded) and `Run.train` gives it back when the
    trainer is closed. In a multi-process run it first joins the run (`train.mesh.join()`, before anything starts
    JAX's backend); process 0 takes the lock and the others wait for process 0 at a barrier."""
    cfg.train.mesh.join()  # a multi-process run is joined before anything can start JAX's backend
    run = Run(cfg, cfg.train.run_dir, log or stderr_logger)
    _lock(run.run_dir)
    run.locked = is_writer()
    try:
        if is_writer():  # process 0 checks a resume's config and writes config.yaml, naming the command
            save_run_config(run.run_dir, cfg, command=command_of(cfg), say=run.say)
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
    """The run dir's lock around a whole command (the CLI's), so it covers the reports after training too (joins a
    multi-process run first; `start_run` says how the lock is held)."""
    cfg.train.mesh.join()
    _lock(cfg.train.run_dir)
    try:
        yield
    finally:
        if is_writer():  # the outermost holder: also what a `start_run` that failed before `train` still held
            release_run_dir(cfg.train.run_dir, every=True)


# -- build ---------------------------------------------------------------------------------------------------


def make_trainer(
    cfg: Any,
    model: Any,
    loss_fn: LossFn,
    *,
    algorithm: str,
    mesh: Any,
    log: Callable[[str], None],
    trainable: Any = nnx.Param,
    eval_loss_fn: LossFn | None = None,
    checkpoint_meta: dict[str, Any] | None = None,
) -> Trainer:
    """The run's `Trainer` of `model` (the module to train, adapters applied, or a
    `tempax.train.trainable.TrainableModel`: a composite, or `Trainable(model, ...)` with what the run adds to the
    memory plan) on `mesh`, trained with `loss_fn` (`eval_loss_fn` scores held-out batches; None: `loss_fn`) on
    the parameters `trainable` selects (`build_model`'s third value). The checkpoints record `algorithm`, the
    config's `model.source` and `checkpoint_meta`. The trainer copies the trainable weights: drop the caller's
    reference to the model afterwards (`del model`), so no second set stays alive during training."""
    source = getattr(getattr(cfg, "model", None), "source", None)
    meta = {"algorithm": algorithm, **({"model_source": source} if source else {}), **(checkpoint_meta or {})}
    return Trainer(model, loss_fn, cfg.train, trainable=trainable, mesh=mesh, log=log, eval_loss_fn=eval_loss_fn,
                   checkpoint_meta=meta)


def write_run_files(run: Run, data: SFTData, tokenizer: Any) -> None:
    """Reports the data and writes data_report.json and the tokenizer into the run dir (`start_run` wrote
    config.yaml): SFT's and distillation's mains, which read their data the same way (`tempax.data.sft`)."""
    run.say(data.report.summary())
    for where, reason, detail in data.report.bad_rows[:5]:
        run.say(f"  skipped {where}: {reason}" + (f" ({detail})" if detail else ""))
    run.write_json("data_report.json", data.report.to_dict())
    run.save_tokenizer(tokenizer)


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


# -- finish --------------------------------------------------------------------------------------------------


def finish_policy(
    run: Run,
    result: RunResult,
    *,
    tokenizer: Any,
    held_rows: Sequence[dict[str, Any]],
    options: Any,
    before: Any,
    evaluate_fn: Callable[..., Any] | None = None,
) -> RunResult:
    """After training a policy (`result.model`, the trainer's): the held-out evaluation (`eval.after`) of
    `held_rows` with `options` (`tempax.eval.spec.eval_options`) by `evaluate_fn` (`evaluate_before`'s; None:
    `tempax.eval.evaluate.evaluate`), the before/after table (eval.json and metrics.jsonl), the adapters of a LoRA
    run and why the run stopped early, if it did; `result` with `before` and `after` set.

    On-policy algorithms that evaluate by generating on held-out problems (GRPO, RFT) take their prompts with
    `task_prompts`, evaluate the starting policy with `evaluate_before` and finish here; generation-based
    evaluations are stages, and `Run.report_stages` prints their table and writes them."""
    cfg, policy = run.config, result.model
    result.before = before
    if held_rows and cfg.eval.after:
        # Adapters folded in: the same function, without the extra adapter matmuls per generated token.
        result.after = (evaluate_fn or evaluate)(merge_lora(policy) if cfg.lora is not None else policy, tokenizer,
                                                 held_rows, options, label="eval after")
        run.say(f"after training: {result.after.summary_line()}")
    stages = [(name, r) for name, r in (("before", before), ("after", result.after)) if r is not None]
    if stages:
        last = result.history[-1][0] if result.history else 0
        run.report_stages(stages, table=format_table(stages), file="eval.json", steps={"before": 0, "after": last})
    run.save_adapters(policy)
    if result.stop_reason:
        run.say(f"stopped early: {result.stop_reason}")
    return result


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
