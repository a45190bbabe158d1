"""The training core every algorithm shares (SFT, pre-training, DPO, reward models, GRPO, PPO, distillation).

An algorithm supplies a loss, `loss_fn(model, batch) -> (loss, metrics)` on one micro-batch (its
`metrics["loss_weight"]` makes gradient accumulation exact: `tempax.train.step`), and a batch source
(`tempax.train.sources.BatchSource`), and runs

    trainer = Trainer(model, loss_fn, cfg.train, trainable=nnx.Param)   # or tempax.models.lora.lora_filter
    result = trainer.fit(batches, hooks=[...], eval_batches=lambda: held_out_batches)

The core owns the rest: the mesh and sharding, bf16 compute over float32 masters, remat, the memory plan, one
jitted step with donation, checkpoints with resume, metrics and hooks with a cadence (`tempax.train.hooks`).
`Trainer.fit` is the only optimisation loop; `trainer.train_step(batch)` runs one step on its own.
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
