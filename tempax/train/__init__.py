"""The training core every algorithm shares (SFT, pre-training, DPO, reward models, GRPO, PPO, distillation).

An algorithm supplies two things:

    loss_fn(model, batch) -> (loss, metrics)
        `batch` is a dict of arrays with a leading batch axis (one micro-batch); `loss` a scalar mean over it.
        Put `metrics["loss_weight"]` = how much this micro-batch counts (e.g. its supervised token count) to make
        gradient accumulation exact; metrics named `num_*` / `*_sum` are summed over micro-batches, other scalars
        averaged with that weight, per-row arrays concatenated.
    batches: a batch source (`tempax.train.sources`): an iterable of fixed-shape global host batches (dicts of
        numpy arrays [batch_size, ...]); with `state()` / `restore(state)` its position is checkpointed (like
        `tempax.data.loader.BatchLoader`); with `attach(trainer)` it can sample from the current policy (GRPO's
        rollouts: `tempax.algorithms.grpo.source.GRPOSource`); `batch_metrics()` joins each step's record.
        A source, like a hook, sees the trainer as a `TrainerView` (`tempax.train.view`), not the loop.

and runs

    trainer = Trainer(model, loss_fn, cfg.train, trainable=nnx.Param)   # or tempax.models.lora.lora_filter
    # a composite model, or a run that adds to the memory plan: tempax.train.trainable (TrainableModel, Trainable)
    result = trainer.fit(batches, hooks=[...], eval_batches=lambda: held_out_batches)

The core owns the rest: the mesh and sharding (`cfg.train.mesh`), bf16 compute over float32 masters, remat, the
memory plan, one jitted step with donation (gradients, micro-batch accumulation, clipping, AdamW + schedule,
non-finite detection), Orbax checkpoints with resume, metrics (progress bar, metrics.jsonl, TensorBoard) and
hooks with a cadence (`Hook`, `every(n, fn)`) that can stop the run (`Stop(reason)`). `Trainer.fit` is the only
optimisation loop; `trainer.train_step(batch)` runs one step on its own (tests and step benchmarks).
"""

from tempax.train.checkpoint import Checkpointer
from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig
from tempax.train.hooks import (
    CheckpointHook,
    EvalHook,
    FunctionHook,
    Hook,
    LoggingHook,
    StepInfo,
    Stop,
    StopTraining,
    every,
)
from tempax.train.loop import Trainer, TrainingDiverged, TrainResult
from tempax.train.memory import MemoryPlan, OutOfMemoryPlan, PlanInputs, plan_memory
from tempax.train.metrics import MetricsWriter, read_metrics
from tempax.train.sources import BatchSource, decode_arrays, encode_arrays
from tempax.train.state import ModelParts, TrainState, init_sharded
from tempax.train.step import LOSS_WEIGHT, LossFn, make_eval_step, make_train_step
from tempax.train.trainable import MemoryProfile, Trainable, TrainableModel
from tempax.train.view import TrainerView

__all__ = [
    "LOSS_WEIGHT",
    "BatchSource",
    "CheckpointConfig",
    "CheckpointHook",
    "Checkpointer",
    "EvalHook",
    "FunctionHook",
    "Hook",
    "LoggingHook",
    "LossFn",
    "MemoryPlan",
    "MemoryProfile",
    "MeshConfig",
    "MetricsWriter",
    "ModelParts",
    "OptimizerConfig",
    "OutOfMemoryPlan",
    "PlanInputs",
    "StepInfo",
    "Stop",
    "StopTraining",
    "TrainConfig",
    "TrainResult",
    "TrainState",
    "Trainable",
    "TrainableModel",
    "Trainer",
    "TrainerView",
    "TrainingDiverged",
    "decode_arrays",
    "encode_arrays",
    "every",
    "init_sharded",
    "make_eval_step",
    "make_train_step",
    "plan_memory",
    "read_metrics",
]
