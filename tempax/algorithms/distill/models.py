"""The teacher, the student, and the one module the train step sees: `StudentTeacher(student, teacher)`.

The training core splits a model into trainable parameters and a frozen rest. Putting both models in one module
and training only `student.*` parameters (`student_filter`) makes the teacher part of that frozen rest: the one
jitted step runs the teacher's forward pass and the student's forward and backward together, the teacher's
weights are never differentiated, donated or checkpointed, and the memory plan sees their bytes.

Teacher storage (`TeacherConfig.storage`): float32 as loaded, bfloat16 (half the bytes; bf16 matmuls), or NF4 /
int8 blockwise-quantized projections (`tempax.models.lora.quantize_base`, QLoRA's frozen base: NF4 takes 4.5 of
bfloat16's 16 bits per projection weight, the block scales included; embeddings and norms stay float).

Student (`StudentConfig`): a copy of the teacher (`source: teacher`), a preset, or any model source; optionally cut
to a subset of its layers (`keep_layers: every 3`, `tempax.models.surgery.keep_layers`). Its vocabulary must be
the teacher's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from tempax.algorithms.common import ModelSourceConfig
from tempax.configlib import help_field
from tempax.errors import ConfigError
from tempax.train.state import set_compute_dtype, training_view
from tempax.train.trainable import MemoryProfile
from tempax.models.lora import lora_filter, quantize_base
from tempax.models.quant import QuantizedLinear
from tempax.models.registry import PRESET_PREFIX
from tempax.models.surgery import keep_layers, layer_selection

TEACHER_SOURCE = "teacher"


@dataclass(frozen=True)
class TeacherConfig(ModelSourceConfig):
    """The frozen teacher and how its weights are stored."""

    storage: Literal["fp32", "bf16", "nf4", "int8"] = help_field(
        "Teacher weight storage: fp32 as loaded; bf16 (half the bytes, bf16 matmuls); nf4 or int8 blockwise-"
        "quantized attention/MLP projections (QLoRA's frozen base).",
        "fp32",
    )
    block_size: int = help_field("With storage nf4/int8: weights per quantization block (QLoRA: 64).", 64)


@dataclass(frozen=True)
class StudentConfig(ModelSourceConfig):
    """The student: `teacher` (a copy of the teacher), a preset or any model source; optionally layer-pruned."""

    source: str = help_field(
        "`teacher` (a copy of the teacher's weights, cut by keep_layers), or a model source like model.source: a "
        "registered name, preset:<name>, a .gguf file, a Hugging Face folder or Hub id.",
        TEACHER_SOURCE,
    )
    tokenizer: str | None = help_field(
        "Tokenizer to load a preset student with; null: the teacher's. The run always tokenises with the teacher's "
        "tokenizer (the vocabularies must match).",
        None,
    )
    keep_layers: str | tuple[int, ...] = help_field(
        "Layers of the source model the student keeps: all, 'every N' (0, N, 2N, ...), 'first N', 'last N' or a "
        "list of indices [0, 3, 6]. Embeddings, final norm and LM head are copied.",
        "all",
    )

    def validate(self) -> None:
        if self.source == TEACHER_SOURCE and (self.overrides or self.tokenizer):
            raise ConfigError("student.overrides / student.tokenizer do not apply to student.source=teacher (a copy)")
        if self.source != TEACHER_SOURCE:
            super().validate()


class StudentTeacher(nnx.Module):
    """Both models of a distillation run in one module (see the module docstring); a
    `tempax.train.trainable.TrainableModel` whose trunk is the student (the teacher is never trained)."""

    def __init__(self, student: nnx.Module, teacher: nnx.Module):
        self.student = student
        self.teacher = teacher

    def training_view(self, *, remat: str | None, precision: str) -> nnx.Module:
        return training_view(self, remat=remat, precision=precision, trunks=("student",))

    def memory_profile(self) -> MemoryProfile:
        return MemoryProfile(model=self.student.config)


student_filter = nnx.All(nnx.Param, nnx.PathContains("student"))
"""Trainable parameters of a `StudentTeacher`: the student's (full fine-tuning of the student)."""


def student_lora_filter() -> Any:
    """Trainable parameters of a `StudentTeacher` whose student has LoRA adapters: the adapters only."""
    return nnx.All(lora_filter, nnx.PathContains("student"))


def check_vocabularies(student: Any, teacher: Any) -> None:
    """Raises `ConfigError` naming both sizes when the models' vocabularies differ."""
    s, t = student.config.vocab_size, teacher.config.vocab_size
    if s != t:
        raise ConfigError(
            f"the student's vocabulary has {s} tokens but the teacher's has {t}; distillation compares their "
            "next-token distributions token by token, so both must use the same tokenizer (pick a student of the "
            "teacher's family, or student.source: teacher with student.keep_layers)"
        )


def store_teacher(teacher: nnx.Module, storage: str, block_size: int = 64) -> nnx.Module:
    """The teacher in its storage format (see the module docstring); `teacher` itself is left as it was."""
    if storage == "fp32":
        return teacher
    if storage == "bf16":
        return cast_model(teacher, "bfloat16")

    return quantize_base(teacher, storage, block_size)


def cast_model(model: nnx.Module, dtype: str) -> nnx.Module:
    """A copy of `model` with floating-point parameters stored in, and layers computing in, `dtype`."""
    model = nnx.clone(model)
    target = jnp.dtype(dtype)
    graphdef, state = nnx.split(model)
    state = jax.tree.map(lambda x: x.astype(target) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    model = nnx.merge(graphdef, state)
    set_compute_dtype(model, dtype)
    model.config = model.config.replace(param_dtype=dtype)
    return model


def build_student(
    spec: StudentConfig, teacher: nnx.Module, *, tokenizer_source: str | None = None, seed: int = 0, mesh: Any = None
) -> nnx.Module:
    """The student of `spec` (copied from the float `teacher` when `spec.source` is `teacher`), vocabulary
    checked against the teacher's. `tokenizer_source` stands in for a preset student's missing tokenizer (the
    run uses the teacher's tokenizer either way)."""
    if spec.source == TEACHER_SOURCE:
        model = teacher
    else:
        tok = spec.tokenizer or (tokenizer_source if spec.source.startswith(PRESET_PREFIX) else None)
        model, _ = ModelSourceConfig(spec.source, tok, dict(spec.overrides)).build(seed=seed, mesh=mesh)
    check_vocabularies(model, teacher)
    layers = layer_selection(spec.keep_layers, model.config.num_layers)
    if layers == tuple(range(model.config.num_layers)):
        return nnx.clone(model) if model is teacher else model
    return keep_layers(model, layers)


def model_bytes(model: nnx.Module) -> int:
    """Bytes of every array the model holds (weights, quantization codes and scales)."""
    return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(nnx.state(model)))


def parameter_count(model: nnx.Module) -> int:
    """Number of weights in the model (a quantized kernel counts its original in x out weights)."""
    total = sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    for _, module in nnx.iter_modules(model):
        if isinstance(module, QuantizedLinear):
            stacked = module.codes[...].ndim == 3  # a decoder's stacked projection: one kernel per layer
            total += module.in_features * module.out_features * (module.codes.shape[0] if stacked else 1)
    return total
