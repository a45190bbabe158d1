"""`Trainer`: sets a model up for training on a mesh and runs the jitted step over batches, with hooks.

    trainer = Trainer(model, loss_fn, cfg.train, trainable=nnx.Param)   # or trainable=lora_filter
    result = trainer.fit(loader, eval_batches=lambda: eval_loader)       # resumes from run_dir if it can

Set-up, in order: the mesh (`cfg.mesh`, with `jax.distributed` when configured); bf16 compute if asked (float32
master weights stay); the model split into trainable params and the rest; the memory plan (printed, and a
`TempaxError` naming the fix when it cannot fit); the sharded optimizer state created directly on the devices;
the step jitted once with the state donated. `fit` then restores the latest checkpoint of `run_dir` (state, RNG
and the batch source's position), attaches the source (`tempax.train.sources`: on-policy sources sample with the
current model), runs `steps - step` steps and calls the hooks at their cadence; a hook can stop the run
(`tempax.train.hooks.Stop`). This is the only optimisation loop: GRPO's rollouts are a batch source.

Sources and hooks get the trainer as a `tempax.train.view.TrainerView`, the few members they may use (the step,
the weights and the forward pieces, `put_batch`, the mesh, the micro-batch size, a handful of settings, `write`,
`log`, `save_checkpoint`, `evaluate`); `Trainer` provides each of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from tempax.errors import TempaxError, device_out_of_memory, is_device_out_of_memory
from tempax.progress import work_bar
from tempax.parallel.process import global_batch, host_tree, is_writer
from tempax.parallel.rules import batch_sharding, use_mesh
from tempax.runtime.caches import jax_cache_in_use
from tempax.runtime.host_memory import available_memory, release_free_heap
from tempax.train import memory as mem
from tempax.train.checkpoint import Checkpointer, CheckpointSaveFailed, unfinished_saves
from tempax.train.config import TrainConfig
from tempax.train.hooks import CheckpointHook, EvalHook, Hook, LoggingHook, StepInfo, Stop, StopTraining
from tempax.train.metrics import MetricsWriter, ProgressBar
from tempax.train.offload import Placement, StreamedUpdate, host_state_shardings
from tempax.train.optim import optimizer_parts
from tempax.train.preemption import GracefulStop, RunStopped
from tempax.train.state import (
    ModelParts,
    TrainState,
    cast_params,
    init_state,
    state_shardings,
)
from tempax.train.storage import write_atomic
from tempax.train.sources import attach_source, batch_metrics, restore_source, source_state
from tempax.train.trainable import TrainableModel, as_trainable
from tempax.train.step import LossFn, average_eval_metrics, make_eval_step, make_train_step

SUMMARY_FILE = "summary.json"


class TrainingDiverged(TempaxError):
    """The loss or the gradients became NaN/inf."""


@dataclass
class TrainResult:
    """What `Trainer.fit` returns.

    Attributes:
      state: the final `TrainState`.
      history: host metrics of every logged step, as (step, metrics).
      eval_history: (step, eval metrics) of every evaluation.
      last_checkpoint: the path of the last checkpoint written, or None.
      resumed_from: the step the run resumed from (0 for a fresh run).
      stop_reason: why a hook (or `Trainer.request_stop`) ended the run early; None when it ran its steps.
      extras: whatever the algorithm adds (e.g. SFT's data report).
    """

    state: TrainState
    history: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    eval_history: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    last_checkpoint: str | None = None
    resumed_from: int = 0
    stop_reason: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def losses(self) -> list[float]:
        return [m["loss"] for _, m in self.history if "loss" in m]

    def series(self, key: str) -> list[tuple[int, float]]:
        """(step, value) of one logged metric."""
        return [(s, m[key]) for s, m in self.history if key in m]


class Trainer:
    """Runs `loss_fn` through the shared jitted train step (see the module docstring).

    Args:
      model: an NNX model (normally a `tempax.models.decoder.Decoder`, possibly with LoRA adapters applied), or
        any `tempax.train.trainable.TrainableModel` (a composite model, or `Trainable(model, ...)` stating what
        the run adds to its memory profile). The trainer copies its trainable arrays (drop your reference to free
        the originals) and trains its `training_view` with `config.remat` / `config.precision` applied; the model
        object you pass is left as it was.
      loss_fn: `loss_fn(model, batch) -> (loss, metrics)`; see `tempax.train.step`.
      config: the `TrainConfig`.
      trainable: NNX filter of the parameters that get gradients and optimizer state (`nnx.Param` by default,
        `lora_filter` for adapters only).
      mesh: a mesh to use instead of building `config.mesh`.
      eval_loss_fn: loss used for evaluation (default `loss_fn`).
      checkpoint_meta: extra JSON stored with every checkpoint (e.g. the recipe).
      log: where set-up messages go (default stderr).
    """

    # Long on purpose: one ordered set-up (view, split, micro-batch plan, placement, sharded state, jitted steps),
    # each step reading what the one before it made; the helpers below hold the parts that stand alone.
    def __init__(
        self,
        model: nnx.Module | TrainableModel,
        loss_fn: LossFn,
        config: TrainConfig,
        *,
        trainable: Any = nnx.Param,
        mesh: Mesh | None = None,
        eval_loss_fn: LossFn | None = None,
        checkpoint_meta: dict[str, Any] | None = None,
        log: Callable[[str], None] | None = None,
    ):
        self.config = config
        self.loss_fn = loss_fn
        self._say = log or (lambda text: print(text, file=sys.stderr))
        self.mesh = mesh if mesh is not None else config.mesh.build()
        self.run_dir = os.path.abspath(config.run_dir)
        self.checkpoint_meta = dict(checkpoint_meta or {})

        self.remat = config.remat
        self.precision = config.precision
        trainable_model = as_trainable(model)
        self.memory_profile = trainable_model.memory_profile()
        model = trainable_model.training_view(remat=self.remat, precision=self.precision)
        model_cfg = self.memory_profile.model
        config.check_model(model_cfg, seq_len=self.memory_profile.tokens_per_row)
        for warning in config.warnings():
            self._say(f"warning: {warning}")

        self.parts, params = ModelParts.split(model, trainable)
        # A model of shapes only (`nnx.eval_shape`) makes a trainer that plans and compiles (`step_memory`) without
        # holding any weight: how bench/memory_plan.py sizes a step for a device it could not hold.
        self.abstract = any(isinstance(v, jax.ShapeDtypeStruct) for v in params.values())
        if self.abstract:
            params = {k: jax.ShapeDtypeStruct(v.shape, jnp.float32 if jnp.issubdtype(v.dtype, jnp.floating)
                                              else v.dtype) for k, v in params.items()}
        else:
            params = cast_params(params, jnp.float32)  # master weights and optimizer state in float32
        self.trainable_keys = tuple(params)
        self.num_trainable = sum(int(v.size) for v in params.values())
        self.full_finetune = trainable is nnx.Param

        mesh_shape = dict(self.mesh.shape)
        self.data_parallel = mesh_shape.get("data", 1) * mesh_shape.get("fsdp", 1)
        self._plan_inputs: mem.PlanInputs | None = None
        self._capacity: int | None = None
        self._first_batch_due = False
        micro, self.memory = self._choose_micro_batch(model_cfg, model, trainable)
        self.micro_batch_size = micro
        self.num_micro_batches = config.batch_size // micro

        # train.memory (tempax.train.memory): bf16 moments, or state in host memory streamed through the device.
        moment_dtype = jnp.bfloat16 if self.memory == "bf16_moments" else None
        self.placement = Placement(
            optimizer_on_host=self.memory in ("offload_optimizer", "offload_optimizer_and_master"),
            master_on_host=self.memory == "offload_optimizer_and_master",
            compute_dtype=jnp.bfloat16 if self.precision == "bf16" else None,
        )
        self.optimizer = config.optimizer.build(config.steps, moment_dtype=moment_dtype)
        self.schedule = config.optimizer.schedule_fn(config.steps)

        with use_mesh(self.mesh), self._out_of_memory_explained("creating the training state"):
            self.param_shardings = self.parts.param_shardings(self.mesh)  # on the device, where the step computes
            abstract = jax.eval_shape(lambda p: init_state(p, self.optimizer, config.seed), params)
            device_state = state_shardings(abstract, self.optimizer, self.param_shardings, self.mesh)
            self.state_shardings = host_state_shardings(device_state, self.optimizer, abstract, self.placement)
            self.rest_shardings = self.parts.rest_shardings(self.mesh)
            self.batch_sharding = batch_sharding(self.mesh)
            seed = config.seed
            self._streamed: StreamedUpdate | None = None
            if self.placement.offloaded:
                clip, update = optimizer_parts(config.optimizer, config.steps, moment_dtype=moment_dtype)
                self._streamed = StreamedUpdate(self.placement, clip, update, self.param_shardings,
                                                device_state.opt_state, self.state_shardings.opt_state)
            if self.abstract:
                with_sharding = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)  # noqa: E731
                self.rest = jax.tree.map(with_sharding, self.parts.rest, self.rest_shardings)
                self.state: TrainState = jax.tree.map(with_sharding, abstract, self.state_shardings)
            else:
                params = jax.device_put(params, self.state_shardings.params)
                self.rest = jax.device_put(self.parts.rest, self.rest_shardings)
                if self._streamed is not None:
                    self.state = self._streamed.init_state(params, seed, self.state_shardings)
                else:
                    self.state = jax.jit(
                        lambda p: init_state(p, self.optimizer, seed), out_shardings=self.state_shardings
                    )(params)
            del params
            step = make_train_step(
                loss_fn, self.parts, self.optimizer, num_micro_batches=self.num_micro_batches,
                schedule=self.schedule, grad_sharding=self.param_shardings, streamed=self._streamed,
            )
            self._step = jax.jit(
                step,
                in_shardings=(self.state_shardings, self.rest_shardings, self.batch_sharding),
                out_shardings=(self.state_shardings, None),
                donate_argnums=(0,),
            )
            self._eval = jax.jit(
                make_eval_step(eval_loss_fn or loss_fn, self.parts,
                               self._streamed if self.placement.master_on_host else None),
                in_shardings=(self.state_shardings.params, self.rest_shardings, self.batch_sharding),
            )
        self.checkpointer: Checkpointer | None = None
        self.writer: MetricsWriter | None = None
        self.progress = ProgressBar(0, enabled=False)
        self._last_checkpoint: str | None = None
        self._history: list[tuple[int, dict[str, float]]] = []
        self._stop_request: str | None = None
        self._heap_released = False  # see train_step

    # -- set-up helpers ---------------------------------------------------------------------------------------
    def _choose_micro_batch(self, model_cfg: Any, model: nnx.Module, trainable: Any) -> tuple[int, str]:
        """(micro-batch size, train.memory setting), from the memory plan when there is one (printed, with the
        memory setting and why)."""
        cfg = self.config
        micro = cfg.micro_batch_size or cfg.batch_size
        fixed = "device" if cfg.memory == "auto" else cfg.memory
        if cfg.batch_size % self.data_parallel:
            raise TempaxError(
                f"batch_size={cfg.batch_size} must be a multiple of the data-parallel devices "
                f"(mesh data x fsdp = {self.data_parallel})"
            )
        if model_cfg is None or not hasattr(model_cfg, "num_params"):
            mem.validate_micro_batch(cfg.batch_size, micro, self.data_parallel)
            return micro, fixed
        profile = self.memory_profile
        total = model_cfg.num_params()
        frozen_count = max(total - self.num_trainable, 0)
        rest_bytes = sum(int(x.size) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(self.parts.rest)
                         if hasattr(x, "dtype") and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))
        inputs = mem.train_plan_inputs(
            cfg, model_cfg,
            trainable_params=profile.full_params if self.full_finetune else self.num_trainable,
            frozen_bytes_per_param=(rest_bytes / frozen_count) if frozen_count and not self.full_finetune else None,
            extra_frozen_bytes=0 if frozen_count else rest_bytes,  # e.g. a distillation teacher beside the model
            tokens_per_row=profile.tokens_per_row, logit_positions=profile.logit_positions,
            held_bytes=profile.held_bytes, trunks=profile.trunks, mesh_shape=tuple(dict(self.mesh.shape).items()),
            remat=self.remat, host_is_separate=self.mesh.devices.flat[0].platform != "cpu",
        )
        if hasattr(model, "hidden_states"):  # a decoder, adapters and all: its own residuals, traced
            inputs = dataclasses.replace(inputs, probe=mem.residual_probe(
                model, trainable, seq_len=inputs.seq_len, precision=cfg.precision))
        self._plan_inputs = inputs
        if not (cfg.check_memory or cfg.auto_micro_batch):
            mem.validate_micro_batch(cfg.batch_size, micro, self.data_parallel)
            return micro, fixed
        capacity = mem.device_capacity(self.mesh.devices.flat)
        free = available_memory() if inputs.host_is_separate else None
        host = None if free is None else free // max(len(jax.local_devices()), 1)  # offloaded state's room a device
        choice = mem.choose_memory(inputs, capacity, requested=cfg.memory, host_capacity=host)
        inputs = dataclasses.replace(inputs, memory=choice.setting)
        if cfg.auto_micro_batch and capacity is not None:
            best = mem.largest_fitting_micro_batch(inputs, cfg.batch_size, capacity)
            if best is not None:
                micro = best
                inputs = dataclasses.replace(inputs, micro_batch_size=micro, num_micro_batches=cfg.batch_size // micro)
        mem.validate_micro_batch(cfg.batch_size, micro, self.data_parallel)
        self._plan_inputs, self._capacity = inputs, capacity
        self._first_batch_due = cfg.check_memory and capacity is not None
        if cfg.check_memory:
            plan = mem.check_fits(inputs, cfg.batch_size, capacity)
            self._say(choice.reason)
            self._say(plan.format())
        return micro, choice.setting

    def memory_plan(self, batch: dict[str, Any] | None = None) -> mem.MemoryPlan | None:
        """The memory plan of this trainer's step (its model, micro-batch, remat, precision and `train.memory`
        setting), against the device's capacity when it was asked for; None for a model without a config. With a
        global host `batch`, the activations are what autodiff keeps for this trainer's own loss on one
        micro-batch of that shape (`tempax.train.memory.loss_probe`), not for the decoder over rows of
        `tokens_per_row`."""
        if self._plan_inputs is None:
            return None
        return mem.plan_memory(self._batch_plan_inputs(batch) if batch is not None else self._plan_inputs,
                               self._capacity)

    def _batch_plan_inputs(self, batch: dict[str, Any]) -> mem.PlanInputs:
        p = self._plan_inputs
        rows = max(self.micro_batch_size // self.data_parallel, 1)
        shapes = {k: jax.ShapeDtypeStruct((rows, *np.shape(v)[1:]), np.asarray(v).dtype) for k, v in batch.items()}
        probe = mem.loss_probe(self.loss_fn, self.parts, self.state.params, self.rest, shapes, tokens=rows * p.seq_len,
                               p=p)
        return dataclasses.replace(p, probe=probe)

    def _check_first_batch(self, batch: dict[str, Any]) -> None:
        """Before the first step compiles: the plan with this loss's own activations on this batch's shapes (a
        step whose rows are not one sequence, GRPO's, holds more or less than the first plan said); a step that
        cannot fit stops here with the settings that would, and a plan that moved by more than 15% is printed."""
        self._first_batch_due = False
        p = self._batch_plan_inputs(batch)
        plan = mem.plan_memory(p, self._capacity)
        first = mem.plan_memory(self._plan_inputs, self._capacity)
        if not plan.fits:
            fixes = mem.suggest_fixes(p, self.config.batch_size, self._capacity)
            raise mem.OutOfMemoryPlan(mem.not_fitting_message(plan, fixes, self._capacity,
                                                              what="the train step on these batches needs"))
        if abs(plan.total - first.total) > 0.15 * first.total:
            self._say(f"on these batches, {plan.format()}")

    @contextlib.contextmanager
    def _out_of_memory_explained(self, what: str) -> Iterator[None]:
        """XLA's out-of-memory error inside the block (compiling or running) becomes a `DeviceOutOfMemory` with
        the plan and the settings that would fit (exit status 2 from the CLI), not a traceback."""
        try:
            yield
        except Exception as e:
            if not is_device_out_of_memory(e):
                raise
            if self._plan_inputs is None:
                raise device_out_of_memory(e, what=what) from None
            raise mem.explain_out_of_memory(e, self._plan_inputs, self.config.batch_size, self._capacity,
                                            what=what) from None

    # -- the model ---------------------------------------------------------------------------------------------
    @property
    def model(self) -> nnx.Module:
        """The current model (trainable arrays of `state` merged with the frozen rest)."""
        return self.parts.merge(self.params, self.rest)

    @property
    def step(self) -> int:
        return int(jax.device_get(self.state.step))

    @property
    def params(self) -> dict[str, jax.Array]:
        """The current trainable arrays (`state.params`; each step donates them, so read them again after one); a
        copy on the device when train.memory keeps them in host memory."""
        if self.placement.master_on_host:
            return jax.device_put(self.state.params, self.param_shardings)
        return self.state.params

    # -- the settings sources and hooks read (`tempax.train.view.TrainerView`) ------------------------------------
    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def learning_rate(self) -> float:
        return self.config.optimizer.learning_rate

    # -- device placement --------------------------------------------------------------------------------------
    def put_batch(self, batch: dict[str, Any]) -> dict[str, jax.Array]:
        """Places a global host batch on the mesh, rows split over the data-parallel axes."""
        return global_batch(batch, self.batch_sharding)  # each process supplies the rows of its own devices

    def train_step(self, batch: dict[str, Any]) -> dict[str, jax.Array]:
        """One optimizer step on a global host batch; updates `state` and returns the device-side metrics.

        No host synchronisation: the metrics stay on the device until something reads them.
        """
        if self.abstract:
            raise TempaxError("this trainer was built from a model of shapes only: it plans and compiles the step "
                              "(step_memory) but holds no weights to train")
        if self._first_batch_due:
            self._check_first_batch(batch)
        with use_mesh(self.mesh), self._out_of_memory_explained("the train step"):
            self.state, metrics = self._step(self.state, self.rest, self.put_batch(batch))
        if not self._heap_released and jax_cache_in_use():
            # The first call loaded the step from JAX's persistent cache, whose loader leaves freed heap behind on
            # its own thread's arena: handed back now, while the step runs, it no longer adds to the peak. Without
            # the cache the same call gained little and may have cost step time, so it is left as it was
            # (docs/measurements/memory.md).
            release_free_heap()
            self._heap_released = True
        return metrics

    def step_memory(self, batch: dict[str, Any]) -> Any:
        """XLA's memory analysis of the compiled train step for a batch of this shape (temporaries, arguments,
        outputs, in bytes), without running it."""
        with use_mesh(self.mesh):
            return self._step.lower(self.state, self.rest, self.put_batch(batch)).compile().memory_analysis()

    # -- logging / checkpoints / eval ----------------------------------------------------------------------------
    def write(self, text: str) -> None:
        """A message above the progress bar (printed plainly when there is none)."""
        self.progress.write(text)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """A record at `step` in metrics.jsonl and the trackers; a training record (no `eval/` key) also joins the
        history `fit` returns and the progress bar's figures."""
        if self.writer is not None:
            self.writer.write(step, metrics)
        if not any(k.startswith("eval/") for k in metrics):
            self._history.append((step, dict(metrics)))
            self.progress.update(0, metrics)

    def save_checkpoint(self, data_state: dict[str, Any] | None = None) -> str:
        """Writes the current state (refuses, with `TrainingDiverged`, when a step was not finite)."""
        self.check_finite()
        if self.checkpointer is None:
            self.checkpointer = self._open_checkpointer()
        meta = {"trainable": "full" if self.full_finetune else "adapters", "keys": list(self.trainable_keys),
                **self.checkpoint_meta}
        try:
            step = self.checkpointer.save(self.state, data_state=data_state, meta=meta)
        except CheckpointSaveFailed as e:
            if self.config.checkpoint.on_save_error != "retry":
                raise
            self._say(f"warning: {e} (train.checkpoint.on_save_error=retry: training goes on)")
            if e.step != self.step:  # an earlier step's background write failed; this step's save is still due
                return self.save_checkpoint(data_state)
            return self._last_checkpoint  # this step's own save failed: the next interval tries again
        self._last_checkpoint = self.checkpointer.path(step)
        return self._last_checkpoint

    def _open_checkpointer(self) -> Checkpointer:
        c = self.config.checkpoint
        return Checkpointer(os.path.join(self.run_dir, "checkpoints"), keep=c.keep, async_save=c.async_save)

    def check_finite(self) -> None:
        """Raises `TrainingDiverged` when some step had a non-finite loss or gradient norm."""
        bad = int(jax.device_get(self.state.bad_step))
        if bad < 0:
            return
        if self.checkpointer is not None:
            self.checkpointer.wait()
        last = self._last_checkpoint or (
            self.checkpointer.path(self.checkpointer.latest_step())
            if self.checkpointer is not None and self.checkpointer.latest_step() is not None else None
        )
        where = f"the last good checkpoint is {last}" if last else "no checkpoint was saved before it"
        raise TrainingDiverged(
            f"loss or gradients became NaN/inf at step {bad + 1}; training stopped and no update from that step "
            f"on was applied ({where}). Lower train.optimizer.learning_rate, keep train.optimizer.grad_clip_norm "
            "set, use train.precision=fp32, or look for a broken batch."
        )

    def evaluate(self, batches: Iterable[dict[str, Any]], *, max_batches: int = 0) -> dict[str, float]:
        """Loss-function metrics averaged over `batches` (weighted by their `loss_weight`), under a labelled
        progress bar (the training bar stands still meanwhile: an evaluation at the end can take minutes)."""
        results = []
        size = len(batches) if hasattr(batches, "__len__") else None
        total = min(size, max_batches) if size is not None and max_batches else (size or max_batches or None)
        shown = None if self.config.progress_bar and is_writer() else False
        with use_mesh(self.mesh), self._out_of_memory_explained("the held-out evaluation"), work_bar(
                total, f"held-out eval at step {self.step}", unit="batch", enabled=shown) as bar:
            for i, batch in enumerate(batches):
                if max_batches and i >= max_batches:
                    break
                out = self._eval(self.state.params, self.rest, self.put_batch(batch))
                results.append({k: float(v) for k, v in host_tree(out).items()})
                bar.update(1)
        return average_eval_metrics(results)

    def restore(self, step: int | None = None) -> dict[str, Any] | None:
        """Loads checkpoint `step` (default latest) of run_dir into `state`; returns its data state (or None)."""
        if self.checkpointer is None:
            self.checkpointer = self._open_checkpointer()
        target = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self.state, self.state_shardings
        )
        if step is None:  # the newest intact checkpoint; damaged newer ones are reported and set aside
            found = self.checkpointer.restore_newest_intact(target, say=self._say)
            if found is None:
                return None
            step, self.state, data_state, _ = found
        else:
            self.state, data_state, _ = self.checkpointer.restore(target, step)
        self._last_checkpoint = self.checkpointer.path(step)
        return data_state

    # -- the loop ------------------------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Ends `fit` after the step in progress, as a hook's `Stop(reason)` does (final checkpoint, reason
        recorded); for callers outside the hooks, e.g. a signal handler."""
        self._stop_request = reason

    def _resume(self, batches: Iterable[dict[str, Any]]) -> int:
        """Restores run_dir's latest checkpoint (state, RNG, the source's position) when allowed; the step."""
        if not self.config.checkpoint.resume:
            return 0
        ckpt_dir = os.path.join(self.run_dir, "checkpoints")
        if not (os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir)):
            return 0
        unfinished = unfinished_saves(ckpt_dir)  # read first: opening the checkpointer deletes them
        dropped = f"an unfinished save of step {', '.join(map(str, unfinished))} (the run stopped while writing it)"
        data_state = self.restore()
        if data_state is None:
            if unfinished:
                self._say(f"{ckpt_dir} holds only {dropped}; starting again from step 0")
            return 0
        restore_source(batches, data_state)
        self._say(f"resumed from {self._last_checkpoint} (step {self.step})"
                  + (f"; dropped {dropped}" if unfinished else ""))
        return self.step

    # Long on purpose: the one optimisation loop, whose try / finally must see every hook, the writer and the
    # checkpointer it opened; what a step does beyond the loop is in `train_step`, `_run_hooks` and `_stop_at`.
    def fit(
        self,
        batches: Iterable[dict[str, Any]],
        *,
        hooks: Sequence[Hook] = (),
        eval_batches: Callable[[], Iterable[dict[str, Any]]] | None = None,
    ) -> TrainResult:
        """Trains until `config.steps` (or a hook's stop), resuming from run_dir's latest checkpoint when allowed.

        Args:
          batches: a batch source (`tempax.train.sources`): an iterable of global host batches (dicts of
            [batch_size, ...] arrays); its `state()` is checkpointed and `restore`d, `attach(trainer)` is called
            before the first batch, and `batch_metrics()` joins each step's record.
          hooks: extra hooks, run before the logging, eval and checkpoint hooks made from the config.
          eval_batches: a zero-argument callable giving held-out batches, evaluated every `eval_every` steps.

        Raises:
          RunStopped: SIGTERM or a first Ctrl-C arrived (`tempax.train.preemption`): the step in flight finished,
            a checkpoint of it was written and waited for, the reason is in metrics.jsonl and summary.json; the
            exception's `exit_status` is 143 / 130. A second Ctrl-C raises `KeyboardInterrupt` at once.
        """
        cfg = self.config
        self._stop_request: str | None = None
        resumed_from = self._resume(batches)
        if resumed_from >= cfg.steps:
            self._say(f"{self.run_dir} has finished: its checkpoint is at step {resumed_from} and train.steps="
                      f"{cfg.steps}; raise train.steps to train further")
        attach_source(batches, self)
        os.makedirs(self.run_dir, exist_ok=True)
        self.writer = MetricsWriter(
            self.run_dir, report_to=cfg.trackers, resume_step=resumed_from, say=self._say,
            config={"train": dataclasses.asdict(cfg)}, run_name=cfg.run_name,
        ) if is_writer() else None  # one writer across processes (tempax.parallel.process)
        self.progress = ProgressBar(cfg.steps, initial=resumed_from, enabled=cfg.progress_bar and is_writer())
        logging_hook = LoggingHook(cfg.log_every, tokens_per_step=cfg.batch_size * cfg.seq_len)
        eval_hooks = [EvalHook(cfg.eval_every, eval_batches, max_batches=cfg.eval_batches,
                               at_start=cfg.eval_at_start)] if eval_batches is not None else []
        all_hooks: list[Hook] = [*hooks, logging_hook, *eval_hooks,
                                 CheckpointHook(cfg.checkpoint.every, at_end=cfg.checkpoint.save_at_end)]
        self._history = []
        iterator: Iterator[dict[str, Any]] = iter(batches)
        step = resumed_from
        stop_reason: str | None = None
        signals = GracefulStop(say=self.progress.write)
        failure: BaseException | None = None
        try:
            with use_mesh(self.mesh), signals, self._out_of_memory_explained("the train step"):
                for hook in all_hooks:
                    hook.start(self)
                while step < cfg.steps and stop_reason is None:
                    if signals.requested:  # it came between steps (in the hooks, or before the first step)
                        stop_reason = self._stop_between_steps(step, signals.signal_name, batches, resumed_from)
                        break
                    t_ask = time.perf_counter()
                    try:
                        host_batch = next(iterator)
                    except StopIteration:
                        self._say(f"data ran out after step {step}; stopping early")
                        break
                    t_got = time.perf_counter()
                    device_metrics = self.train_step(host_batch)
                    step += 1
                    if step == resumed_from + 1:
                        # The first step includes compilation; start the throughput clock after it.
                        jax.block_until_ready(self.state.step)
                        logging_hook.reset_clock(step)
                    self.progress.update(1)
                    if signals.requested and self._stop_request is None:
                        self.request_stop(signals.signal_name)
                    stop_reason = self._stop_request
                    is_last = step >= cfg.steps or stop_reason is not None
                    if not any(h.due(step, is_last) for h in all_hooks) and stop_reason is None:
                        continue
                    self.check_finite()  # also waits for the step: train_s below is its real duration
                    info = StepInfo(step, self, is_last, functools.partial(source_state, batches), device_metrics,
                                    batch_metrics(batches), data_s=t_got - t_ask,
                                    train_s=time.perf_counter() - t_got, stop_reason=stop_reason)
                    stop_reason = self._run_hooks(all_hooks, info, logging_hook)
                    if stop_reason is not None:
                        self._stop_at(step, stop_reason, info)
                self.check_finite()
        except BaseException as e:
            failure = e
            raise
        finally:
            for hook in all_hooks:
                hook.end(self)
            self.progress.close()
            if self.writer is not None:
                self.writer.close()
            if self.checkpointer is not None:
                try:
                    self.checkpointer.wait()  # the last save's background write, and its failure
                except CheckpointSaveFailed as e:
                    if failure is None:
                        raise
                    self._say(str(e))  # the error already on its way out is the one the user gets
        eval_history = [h for hook in eval_hooks for h in hook.history]
        result = TrainResult(
            state=self.state, history=list(self._history), eval_history=eval_history,
            last_checkpoint=self._last_checkpoint, resumed_from=resumed_from, stop_reason=stop_reason,
        )
        self._write_summary(step, result)
        if signals.requested and stop_reason == signals.signal_name:
            raise RunStopped(step, signals.signal_name, self._last_checkpoint if step > resumed_from else None)
        return result

    def _run_hooks(self, all_hooks: Sequence[Hook], info: StepInfo, logging_hook: LoggingHook) -> str | None:
        """Calls the due hooks in order; a `Stop` makes the rest run as at the last step. Returns the reason."""
        if info.stop_reason is not None:
            info.add_metrics({"stop_reason": info.stop_reason})
        for hook in all_hooks:
            if not hook.due(info.step, info.is_last):
                continue
            try:
                out = hook(info)
            except StopTraining as stop:
                out = Stop(stop.reason)
            if isinstance(out, Stop) and info.stop_reason is None:
                info.stop_reason, info.is_last = out.reason, True
                info.add_metrics({"stop_reason": out.reason})
            if isinstance(hook, EvalHook):
                logging_hook.reset_clock(info.step)
        return info.stop_reason

    def _stop_at(self, step: int, reason: str, info: StepInfo) -> None:
        """A stop before `config.steps`: the step's checkpoint (even without save_at_end), the reason as an event
        record, and say why."""
        self.save_checkpoint(info.data_state)  # a no-op when the checkpoint hook just wrote this step
        self._record_stop(step, reason)

    def _stop_between_steps(self, step: int, reason: str, batches: Any, resumed_from: int) -> str:
        """A signal that arrived after step `step`'s hooks: its checkpoint (a no-op when the hooks wrote it), the
        reason as an event record, no further batch drawn (an on-policy source would sample a whole rollout)."""
        if step > resumed_from:
            self.save_checkpoint(source_state(batches))
        self._record_stop(step, reason)
        return reason

    def _record_stop(self, step: int, reason: str) -> None:
        """Every early stop leaves the same record, {"step": N, "event": "stop", "stop_reason": ...}, whether it
        came during a step (then the step's own record carries `stop_reason` too) or between steps, so a reader
        or a scheduler's script finds it in one place."""
        if self.writer is not None:  # only the writing process keeps metrics.jsonl
            self.writer.event(step, "stop", stop_reason=reason)
        self.progress.write(f"stopped after step {step}: {reason} (checkpoint {self._last_checkpoint})")

    def _write_summary(self, step: int, result: TrainResult) -> None:
        """<run_dir>/summary.json: where the run ended and why (read by the CLI and by people)."""
        summary = {"step": step, "steps": self.config.steps, "resumed_from": result.resumed_from,
                   "stop_reason": result.stop_reason, "last_checkpoint": result.last_checkpoint}
        if is_writer():
            write_atomic(os.path.join(self.run_dir, SUMMARY_FILE), json.dumps(summary, indent=2))

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
            self.checkpointer = None
