"""Knowledge distillation on the shared training core: a frozen teacher, a student, a chunked KD loss.

    cfg = load_config(DistillConfig, "recipes/distill_smollm2.yaml", ["train.steps=20"])
    result = main(cfg)

The algorithm is two pieces, everything else is `tempax.train`: the loss, `make_distill_loss`, and the
batches (`main` says which data each `mode` trains on, what it reports and writes). `loss.alpha: 0` trains the same
student with plain cross-entropy on the same batches (the teacher then only feeds the metrics): the baseline a
distillation run is compared with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Literal

import jax
from flax import nnx

from tempax.algorithms.distill.losses import LMHead, check_distill_args, chunked_distillation_loss
from tempax.algorithms.distill.models import (
    StudentConfig,
    StudentTeacher,
    TeacherConfig,
    build_student,
    model_bytes,
    parameter_count,
    store_teacher,
    student_filter,
    student_lora_filter,
)
from tempax.algorithms.distill.gkd import GKDSource, OnPolicyConfig
from tempax.algorithms.distill.sequence import SequenceKDConfig, answerable_prompts, teacher_generations, write_jsonl
from tempax.algorithms.run import RunResult, make_trainer, start_run, write_run_files
from tempax.configlib import help_field
from tempax.data.sft import SFTDataConfig, build_data, read_data_rows
from tempax.errors import ConfigError
from tempax.models.lora import LoraConfig, apply_lora, has_adapters, merge_lora
from tempax.train.config import TrainConfig
from tempax.train.trainable import Trainable
from tempax.data.sources import holdout_split, read_rows
from tempax.models.hf_io import save_hf_checkpoint


@dataclass(frozen=True)
class DistillLossConfig:
    """The distillation loss L = alpha T^2 D(p_T, p_S) + (1 - alpha) CE (`tempax.algorithms.distill.losses`)."""

    kind: Literal["forward_kl", "reverse_kl", "jsd"] = help_field(
        "Divergence D: forward_kl KL(teacher||student) (Hinton), reverse_kl KL(student||teacher) (MiniLLM), jsd "
        "generalised Jensen-Shannon with jsd_beta (GKD).",
        "forward_kl",
    )
    temperature: float = help_field("Softmax temperature T of both models in D; the KD term is scaled by T^2.", 1.0)
    alpha: float = help_field("Weight of the KD term; 1 - alpha weights the label cross-entropy (0: plain SFT).", 0.5)
    jsd_beta: float = help_field("jsd: the teacher's weight in the mixture M = beta p_T + (1 - beta) p_S.", 0.5)
    top_k: int = help_field("Renormalise the teacher over its k most likely tokens (0: its whole distribution).", 0)
    chunk_len: int | None = help_field(
        "Sequence positions per chunk of logits (both models' [B, chunk, V] at a time); null: whole rows.", 64
    )

    def validate(self) -> None:
        check_distill_args(self.kind, self.temperature, self.alpha, self.jsd_beta, self.top_k)
        if self.chunk_len is not None and self.chunk_len < 1:
            raise ConfigError(f"loss.chunk_len must be >= 1 or null, got {self.chunk_len}")


@dataclass(frozen=True)
class DistillConfig:
    """Knowledge distillation of a teacher into a student (logit KD, sequence-level KD, on-policy GKD)."""

    teacher: TeacherConfig = help_field("The frozen teacher.", default_factory=TeacherConfig)
    student: StudentConfig = help_field(
        "The student (default: every third layer of the teacher).",
        default_factory=lambda: StudentConfig(keep_layers="every 3"),
    )
    lora: LoraConfig | None = help_field("LoRA adapters on the student; null: train all the student's weights.", None)
    mode: Literal["off_policy", "sequence", "on_policy"] = help_field(
        "off_policy: KD on the dataset's rows; sequence: the teacher answers the rows' prompts first and the "
        "student trains on those answers (sequence-level KD, settings under `sequence`); on_policy: GKD, a "
        "fraction on_policy.lmbda of the batches are the student's own samples scored by the teacher.",
        "off_policy",
    )
    data: SFTDataConfig = help_field("The data (chat, prompt/completion or text rows, as for SFT).",
                                     default_factory=SFTDataConfig)
    loss: DistillLossConfig = help_field("The distillation loss.", default_factory=DistillLossConfig)
    sequence: SequenceKDConfig = help_field("Teacher generations for mode: sequence.", default_factory=SequenceKDConfig)
    on_policy: OnPolicyConfig = help_field("Student samples for mode: on_policy (GKD).", default_factory=OnPolicyConfig)
    train: TrainConfig = help_field("The training loop.", default_factory=TrainConfig)
    save_student: bool = help_field("Write the trained student as a Hugging Face folder to <run_dir>/student.", True)


def make_distill_loss(
    spec: DistillLossConfig,
) -> Callable[[StudentTeacher, dict[str, jax.Array]], tuple[jax.Array, dict]]:
    """`loss_fn(pair, batch)` for the shared train step: both models' final hidden states on the batch's tokens,
    then `chunked_distillation_loss` (alpha T^2 D(p_T, p_S) + (1 - alpha) CE, chunk by chunk over positions).
    `pair` is a `StudentTeacher`; only the student's parameters are trainable, so the teacher is part of the
    frozen rest of the one jitted step.

    batch: `tokens`, `targets`, `loss_mask`, `positions`, `segment_ids`, each [B, T] (`tempax.data.packing`).
    Both models read the same tokens (packed examples kept apart by segment ids); the loss is
    `chunked_distillation_loss` over the positions where `loss_mask` is 1, and `loss_weight` is their count, so
    gradient accumulation gives the full-batch token mean.
    """
    def loss_fn(pair: StudentTeacher, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        kw = dict(positions=batch["positions"], segment_ids=batch["segment_ids"])
        h_s, _ = pair.student.hidden_states(batch["tokens"], **kw)
        h_t, _ = pair.teacher.hidden_states(batch["tokens"], **kw)
        loss, metrics = chunked_distillation_loss(
            h_s, LMHead.of(pair.student), h_t, LMHead.of(pair.teacher), batch["targets"], batch["loss_mask"],
            kind=spec.kind, temperature=spec.temperature, alpha=spec.alpha, jsd_beta=spec.jsd_beta,
            top_k=spec.top_k, chunk_len=spec.chunk_len,
        )
        metrics = dict(metrics)
        metrics["loss_weight"] = metrics["num_tokens"]
        return loss, metrics

    return loss_fn


def build_models(cfg: DistillConfig, mesh: Any = None) -> tuple[StudentTeacher, Any, Any]:
    """(StudentTeacher, tokenizer, trainable filter): the teacher loaded, the student made from it (or loaded)
    while the teacher is still float, adapters put on the student, then the teacher stored as configured."""
    seed = cfg.train.seed
    teacher, tokenizer = cfg.teacher.build(seed=seed, mesh=mesh)
    if tokenizer is None:
        raise ConfigError(f"teacher.source={cfg.teacher.source} has no tokenizer; set teacher.tokenizer")
    student = build_student(cfg.student, teacher, tokenizer_source=cfg.teacher.tokenizer or cfg.teacher.source,
                            seed=seed, mesh=mesh)
    trainable: Any = student_filter
    if cfg.lora is not None:
        student = apply_lora(student, cfg.lora, rngs=nnx.Rngs(seed + 1))
        trainable = student_lora_filter()
    teacher = store_teacher(teacher, cfg.teacher.storage, cfg.teacher.block_size)
    return StudentTeacher(student, teacher), tokenizer, trainable


def describe_sizes(pair: StudentTeacher) -> str:
    s, t = pair.student, pair.teacher
    return (f"teacher: {t.config.num_layers} layers, {parameter_count(t) / 1e6:.1f}M weights, "
            f"{model_bytes(t) / 2**20:.0f} MiB; student: {s.config.num_layers} layers, "
            f"{parameter_count(s) / 1e6:.1f}M weights, {model_bytes(s) / 2**20:.0f} MiB")


def split_rows(cfg: DistillConfig, rows: list[Any]) -> tuple[list[Any], list[Any]]:
    """(training rows, held-out rows): the first `data.max_rows`, then `data.eval_fraction` held out (the SFT
    split). Done before any generation, so evaluation is always on the dataset's own rows."""
    if cfg.data.max_rows is not None:
        rows = rows[: cfg.data.max_rows]
    if cfg.data.eval_fraction > 0:
        return holdout_split(rows, cfg.data.eval_fraction, seed=cfg.train.seed)
    return rows, []


def sequence_rows(cfg: DistillConfig, teacher: Any, tokenizer: Any, rows: list[Any],
                  say: Callable[[str], None]) -> list[Any]:
    """Rows of the teacher's answers to `rows`' prompts (written to, or reused from, `sequence.output`)."""
    path = cfg.sequence.output or os.path.join(cfg.train.run_dir, "teacher_generations.jsonl")
    if not (cfg.sequence.reuse and os.path.isfile(path)):
        generated = teacher_generations(teacher, tokenizer, rows, cfg.sequence, max_len=cfg.train.seq_len,
                                        seed=cfg.train.seed, say=say)
        write_jsonl(generated, path)
        say(f"sequence KD: wrote {len(generated)} teacher answers to {path}")
    else:
        say(f"sequence KD: reusing the teacher answers in {path}")
    return read_rows(path)


def main(cfg: DistillConfig, *, hooks: tuple = (), log: Callable[[str], None] | None = None) -> RunResult:
    """Distils per `cfg`; writes config.yaml, data_report.json, the tokenizer, metrics, checkpoints and the
    trained student (`<run_dir>/student`) to run_dir. `result.extras` holds `sizes` (parameter counts and bytes
    of both models) and the data report.

    The batches: the SFT data layer (`tempax.data.sft.build_data`) on the dataset's rows (`mode: off_policy`), or
    on the teacher's own answers to the rows' prompts (`mode: sequence`, sequence-level KD,
    `tempax.algorithms.distill.sequence`), or a batch source mixing those rows with the student's own samples
    (`mode: on_policy`, GKD, `tempax.algorithms.distill.gkd`).

    Metrics (training and held-out): `loss`, `kd_loss` (the divergence at temperature T), `ce_loss` (label
    cross-entropy), `agreement` (student and teacher pick the same top-1 token), `token_accuracy`. With
    `train.eval_at_start` the held-out figures before training are logged too. At the end the student is written
    as a Hugging Face folder (`<run_dir>/student`) that `tempax.load` and `transformers` read.
    """
    run = start_run(cfg, log=log)
    say, t = run.say, cfg.train
    rows = read_data_rows(cfg.data)  # a wrong path fails here, before any model is loaded
    pair, tokenizer, trainable = build_models(cfg, run.mesh)
    say(describe_sizes(pair))
    rows, eval_rows = split_rows(cfg, rows)
    if cfg.mode == "sequence":
        rows = sequence_rows(cfg, pair.teacher, tokenizer, rows, say)
    data = build_data(cfg.data, tokenizer, batch_size=t.batch_size, seq_len=t.seq_len, seed=t.seed, rows=rows,
                      eval_rows=eval_rows)
    write_run_files(run, data, tokenizer)
    batches: Any = data.train
    if cfg.mode == "on_policy":
        prompts = answerable_prompts(rows, tokenizer, max_len=t.seq_len, max_new_tokens=cfg.on_policy.max_new_tokens,
                                     say=say)
        batches = GKDSource(data.train, prompts.ids, tokenizer, cfg.on_policy, batch_size=t.batch_size,
                            seq_len=t.seq_len, pad_id=tokenizer.pad_id, seed=t.seed)
    sizes = {
        "teacher_params": parameter_count(pair.teacher), "teacher_bytes": model_bytes(pair.teacher),
        "student_params": parameter_count(pair.student), "student_bytes": model_bytes(pair.student),
        "teacher_layers": pair.teacher.config.num_layers, "student_layers": pair.student.config.num_layers,
    }
    trainer = make_trainer(cfg, Trainable(pair, logit_positions=cfg.loss.chunk_len), make_distill_loss(cfg.loss),
                           algorithm="DistillConfig", trainable=trainable, mesh=run.mesh, log=say,
                           checkpoint_meta={"teacher_source": cfg.teacher.source,
                                            "student_source": cfg.student.source})
    del pair  # the trainer holds the weights now
    result = run.train(trainer, batches, hooks=hooks, eval_batches=data.eval_loader)
    if cfg.save_student:
        result.extras["student_dir"] = save_student(trainer.model.student, tokenizer, run.path("student"))
        say(f"student written to {result.extras['student_dir']}")
    result.extras["sizes"] = sizes
    result.extras["data_report"] = data.report
    return result


def save_student(student: Any, tokenizer: Any, folder: str) -> str:
    """The student as a Hugging Face folder (LoRA adapters merged into its weights)."""
    if has_adapters(student):
        student = merge_lora(student)
    return save_hf_checkpoint(student, folder, tokenizer=tokenizer)
