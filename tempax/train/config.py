"""Typed configs of the training core: mesh, checkpoints and the loop (and, from `tempax.train.optim`, where it
lives beside the schedule and optimizer it builds, the optimizer's).

Every algorithm's recipe embeds a `TrainConfig` under `train:`; the fields are documented once, on their class,
and reachable from YAML and from `train.optimizer.learning_rate=1e-4` overrides. Configs build their objects
(`cfg.optimizer.build(total_steps)`, `cfg.mesh.build()`), and are never mutated after parsing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tempax.errors import ConfigError
from tempax.configlib import help_field
from tempax.train.trackers import check_report_to
from tempax.parallel import init_distributed, make_mesh
from tempax.train.optim import OptimizerConfig, warmup_steps_of

if TYPE_CHECKING:
    from jax.sharding import Mesh


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh ('data', 'fsdp', 'tensor') and multi-host start-up. -1 on one axis means "the rest"."""

    data: int = help_field("Pure data-parallel axis size (-1: the devices the other axes leave).", -1)
    fsdp: int = help_field("Data-parallel axis whose parameters and optimizer state are split (FSDP / ZeRO-3).", 1)
    tensor: int = help_field("Tensor-parallel axis size (splits heads, MLP and vocabulary).", 1)
    num_devices: int | None = help_field("Use only the first N devices (null: all).", None)
    coordinator_address: str | None = help_field("Multi-host: host:port of process 0 (null: single host).", None)
    num_processes: int | None = help_field("Multi-host: number of processes.", None)
    process_id: int | None = help_field("Multi-host: this process's index.", None)
    cluster: bool = help_field(
        "Multi-host: let JAX discover the coordinator, process count and index from the cluster (SLURM, Open MPI, "
        "Kubernetes, Cloud TPU). `tempax launch` and the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / "
        "JAX_PROCESS_ID environment need no flag.",
        False,
    )
    init_timeout_s: int = help_field(
        "Multi-host: seconds to wait for every process to join (and for the coordinator's address to answer) before "
        "failing.", 300)
    heartbeat_timeout_s: int = help_field(
        "Multi-host: seconds without a heartbeat after which a process counts as lost; the others then stop with "
        "one line naming it (exit status 5) and the newest intact checkpoint stays.", 100)
    shutdown_timeout_s: int = help_field("Multi-host: seconds the processes wait for each other at the end.", 300)

    def join(self) -> bool:
        """Joins the multi-process run when one is configured (these fields, `tempax launch`'s environment, or
        `cluster`); a no-op otherwise. Must come before anything starts JAX's backend (even
        `jax.process_index()`), so `tempax.algorithms.run.start_run` calls it first; `build` calls it too."""
        return init_distributed(self.coordinator_address, self.num_processes, self.process_id, cluster=self.cluster,
                                timeout_s=self.init_timeout_s, heartbeat_timeout_s=self.heartbeat_timeout_s,
                                shutdown_timeout_s=self.shutdown_timeout_s)

    def build(self) -> "Mesh":
        """Joins the multi-process run when configured (`join`), then makes the mesh."""
        import jax


        self.join()
        devices = jax.devices()
        if self.num_devices is not None:
            if not 1 <= self.num_devices <= len(devices):
                raise ConfigError(f"train.mesh.num_devices={self.num_devices} but {len(devices)} devices are present")
            devices = devices[: self.num_devices]
        return make_mesh(self.data, self.fsdp, self.tensor, devices=devices)


@dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints in `<run_dir>/checkpoints/<step>/`."""

    every: int = help_field("Save every N steps (0: only at the end).", 0)
    keep: int = help_field("Keep the last N checkpoints (older ones are deleted).", 2)
    save_at_end: bool = help_field("Save after the last step.", True)
    async_save: bool = help_field("Write in a background thread while training continues.", True)
    resume: bool = help_field("Continue from the latest checkpoint in run_dir when there is one.", True)
    on_save_error: Literal["stop", "retry"] = help_field(
        "When a checkpoint cannot be written (disk full, I/O error): stop (exit status 4; the previous checkpoint "
        "stays the newest intact one) or retry (say so in one line, keep training and try again at the next "
        "checkpoint; a failed final checkpoint still stops with status 4).",
        "stop",
    )

    def validate(self) -> None:
        if self.every < 0:
            raise ConfigError(f"every must be >= 0, got {self.every}")
        if self.keep < 1:
            raise ConfigError(f"keep must be >= 1, got {self.keep}")


@dataclass(frozen=True)
class TrainConfig:
    """The training loop, shared by every algorithm (SFT, pre-training, DPO, reward models, GRPO...)."""

    steps: int = help_field("Optimizer steps to run (total, counting steps of a resumed run).", 100)
    batch_size: int = help_field("Global batch size in rows (sequences) per optimizer step, across all devices.", 8)
    micro_batch_size: int | None = help_field(
        "Rows per forward/backward pass; gradients of batch_size / micro_batch_size passes are accumulated. "
        "null: the whole batch at once.",
        None,
    )
    auto_micro_batch: bool = help_field(
        "Pick the largest micro-batch that the memory plan says fits (overrides micro_batch_size).", False
    )
    seq_len: int = help_field("Tokens per row.", 512)
    precision: Literal["fp32", "bf16"] = help_field(
        "fp32: everything float32. bf16: bfloat16 activations and matmuls (bf16 operands, float32 accumulation "
        "and weight gradients: ops.projection_dot) with float32 master weights and optimizer state.",
        "fp32",
    )
    remat: Literal["none", "full", "dots"] | None = help_field(
        "Per-layer activation recomputation: none, full (save only layer inputs) or dots (save matmul outputs); "
        "null keeps the model's setting.",
        None,
    )
    memory: Literal["auto", "device", "bf16_moments", "offload_optimizer", "offload_optimizer_and_master"] = help_field(
        "Where the training state lives, fastest first: device (float32 master weights and optimizer state on the "
        "device), bf16_moments (the optimizer's moments stored in bfloat16, computed in float32), "
        "offload_optimizer (the optimizer's state in host memory, streamed through the device for the update), "
        "offload_optimizer_and_master (the float32 master weights in host memory too; the device holds the copy "
        "the forward pass reads, bf16 under precision=bf16). auto: the fastest the memory plan says fits, printed "
        "with the reason before compiling.",
        "auto",
    )
    optimizer: OptimizerConfig = help_field("Optimizer and schedule.", default_factory=OptimizerConfig)
    mesh: MeshConfig = help_field("Device mesh.", default_factory=MeshConfig)
    checkpoint: CheckpointConfig = help_field("Checkpointing.", default_factory=CheckpointConfig)
    log_every: int = help_field("Log metrics (progress bar, metrics.jsonl, TensorBoard) every N steps.", 1)
    eval_every: int = help_field("Evaluate on the held-out batches every N steps (0: only at the end, if any).", 0)
    eval_batches: int = help_field("Held-out batches per evaluation (0: all of them).", 0)
    eval_at_start: bool = help_field(
        "Also evaluate before the first step (the 'before' of a before/after comparison; TRL's eval_on_start).",
        False,
    )
    seed: int = help_field("Seed of parameter init, data order and the step RNG.", 0)
    run_dir: str = help_field("Where metrics, TensorBoard events, checkpoints and the resolved config go.", "runs/run")
    tensorboard: bool = help_field(
        "Write TensorBoard event files to <run_dir>/tb when report_to names tensorboard; false turns them off "
        "whatever report_to says.",
        True,
    )
    report_to: tuple[str, ...] = help_field(
        "Experiment trackers that get every metrics.jsonl record (TRL's names): tensorboard, wandb (pip install "
        "'tempax[wandb]'; WANDB_MODE=offline writes <run_dir>/wandb), mlflow (pip install 'tempax[mlflow]'; "
        "MLFLOW_TRACKING_URI). [] or [none]: metrics.jsonl only. See docs/trackers.md.",
        ("tensorboard",),
    )
    run_name: str | None = help_field("The run's name in W&B and MLflow (null: the run_dir's folder name).", None)
    progress_bar: bool = help_field("Show a progress bar on the console.", True)
    check_memory: bool = help_field("Estimate peak memory before compiling and stop early when it cannot fit.", True)
    allow_config_change: bool = help_field(
        "Resume a run dir whose config.yaml differs in a way that changes the trajectory (optimizer, data, model, "
        "seq_len, batch...); the change is recorded with its step in <run_dir>/config_changes.jsonl. false: such a "
        "resume stops with the list of differences.",
        False,
    )

    def validate(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.micro_batch_size is not None:
            if self.micro_batch_size < 1 or self.batch_size % self.micro_batch_size:
                raise ConfigError(
                    f"micro_batch_size={self.micro_batch_size} must divide batch_size={self.batch_size}"
                )
        if self.seq_len < 2:
            raise ConfigError(f"seq_len must be >= 2, got {self.seq_len}")
        if self.log_every < 1:
            raise ConfigError(f"log_every must be >= 1, got {self.log_every}")
        if self.eval_every < 0 or self.eval_batches < 0:
            raise ConfigError("eval_every and eval_batches must be >= 0")
        check_report_to(self.report_to)

    @property
    def trackers(self) -> tuple[str, ...]:
        """The trackers this run reports to: `report_to` without "none", less tensorboard when `tensorboard` is
        false."""
        return tuple(t for t in check_report_to(self.report_to) if t != "tensorboard" or self.tensorboard)

    def warnings(self) -> list[str]:
        """Settings that are valid but almost certainly not meant (printed before training starts)."""
        out = []
        opt = self.optimizer
        if opt.learning_rate == 0:
            out.append("train.optimizer.learning_rate=0: no trainable weight will change; the run only measures "
                       "the loss")
        # Step s (from 0) of the warm-up uses peak * (s + 1) / warmup (`tempax.train.optim`).
        warmup = warmup_steps_of(opt, self.steps)
        fix = "lower train.optimizer.warmup_steps or raise train.steps"
        if warmup > self.steps:
            last = opt.learning_rate * self.steps / warmup
            out.append(
                f"train.optimizer.warmup_steps={warmup} is longer than train.steps={self.steps}: the learning rate "
                f"never reaches its peak {opt.learning_rate:g} (the last step uses {last:.3g}); {fix}"
            )
        elif warmup == self.steps and warmup > 1:
            out.append(
                f"train.optimizer.warmup_steps={warmup} equals train.steps={self.steps}: the whole run is warm-up, "
                f"so the learning rate reaches its peak {opt.learning_rate:g} only at the last step and never "
                f"decays; {fix}"
            )
        return out

    def check_model(self, model_config: Any, *, seq_len: int | None = None) -> None:
        """Raises `ConfigError` when a row (`seq_len` tokens; None: `train.seq_len`) is longer than the model's
        positions (`max_position_embeddings`)."""
        limit = getattr(model_config, "max_position_embeddings", None)
        row = f"train.seq_len={self.seq_len}" if seq_len is None else f"a training row of {seq_len} tokens"
        seq_len = self.seq_len if seq_len is None else seq_len
        if isinstance(limit, int) and seq_len > limit:
            raise ConfigError(
                f"{row} is longer than the model's max_position_embeddings={limit}: positions "
                f"past {limit} were never trained and the run would learn from them silently. Set train.seq_len "
                f"<= {limit}"
            )

    @property
    def accumulation_steps(self) -> int:
        return self.batch_size // (self.micro_batch_size or self.batch_size)
