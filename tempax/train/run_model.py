"""A training run's directory as a model source: the model it trained, from its newest intact checkpoint, with
LoRA adapters folded into the weights.

Every command that takes a model (`generate`, `chat`, `eval`, `serve`, `export`, `model-info`, and `model.source`
of a training recipe, e.g. DPO started from an SFT run) goes through `load_source`, which accepts a run dir beside
everything `tempax.models.registry.load` accepts. A run dir is rebuilt from its `config.yaml`: the model section's
source (itself possibly a run dir: runs chain), the LoRA/QLoRA configuration, then the trainable arrays of the
checkpoint; the run's own `tokenizer/` folder when it wrote one. A damaged newest checkpoint is skipped, in one
line, for the newest one that reads (nothing in the run dir is moved or removed: the run may still be writing it).

Which command made a run, and where such a run keeps its model, is the algorithm's to say, not the training
core's: the caller passes `describe`, which gives a run dir's `RunKind` (its command and the layout its
algorithm's record states; `tempax.algorithms.run_dirs` is the `describe` the commands use). Four layouts
(`RunModelLayout.kept`): the checkpoints hold the model (above); a Hugging Face folder the run writes when it
finishes (a distillation's `student/`); PEFT adapters a LoRA run writes when it finishes, on its base (its
checkpoints hold more than the model: PPO's value head); no model at all (a reward model). A run with no model yet,
or none to give, is one `RunHasNoModel` line naming the run dir and the command that makes one (or what to do
instead).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from tempax.errors import CheckpointError, ConfigError
from tempax.models import registry
from tempax.models.registry import RUN_CONFIG_FILE, is_run_dir

__all__ = ["Describe", "RunHasNoModel", "RunKind", "RunModelLayout", "TrainedModel", "is_run_dir", "load_run",
           "load_source", "merged", "run_config", "shape_source"]

# The layouts whose model is a folder the run writes at its end, not a checkpoint step.
_FINAL_FOLDERS = ("folder", "adapters")


class RunHasNoModel(CheckpointError):
    """A run dir from which no model can be made (yet): the message names the dir and the command that makes one."""


class RunModelLayout(Protocol):
    """Where a run keeps the model it trained (`tempax.algorithms.registry.RunModel` is the record's).

    Attributes:
      kept: "checkpoint", "folder", "adapters" or "none" (the module docstring).
      folder: the folder under the run dir that "folder" and "adapters" read.
      note: a clause the messages quote: ("folder") when the folder is written, ("adapters") why the checkpoints
        are not the model, ("none") why there is none and what to do instead, with `{run_dir}` and `{source}` (the
        run's model.source) filled in.
    """

    kept: str
    folder: str
    note: str


@dataclass(frozen=True)
class RunKind:
    """What `describe(run_dir)` says of a run dir: the command that made it and where it keeps its model."""

    command: str
    model: RunModelLayout

    def command_line(self, run_dir: str) -> str:
        """The command line that continues (or finishes) the run in `run_dir`."""
        return f"tempax {self.command} --config {os.path.join(run_dir, RUN_CONFIG_FILE)}"


Describe = Callable[[str], RunKind]


@dataclass
class TrainedModel:
    """What `load_run` gives.

    Attributes:
      model: the trained model (adapters merged unless asked otherwise).
      tokenizer: the run's tokenizer (its `tokenizer/` folder, else its model source's), or None.
      meta: the checkpoint's meta record ({"trainable": "full" | "adapters", "keys": [...]}); empty for a model
        read from a folder the run wrote at its end.
      step: the checkpoint step read; None for a model read from such a folder.
    """

    model: Any
    tokenizer: Any
    meta: dict[str, Any]
    step: int | None


def run_config(run_dir: str) -> dict[str, Any]:
    """The run's config.yaml as a dict."""
    import yaml

    path = os.path.join(run_dir, RUN_CONFIG_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} not found; a run dir is the train.run_dir of a tempax training run")
    try:
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise CheckpointError(f"{path} cannot be read ({type(e).__name__}: {e}); it is the run's config") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} is not a mapping of config sections; it is the run's config")
    return raw


def load_source(
    source: str | os.PathLike,
    *,
    describe: Describe,
    tokenizer: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    seed: int = 0,
    mesh: Any = None,
    dtype: str | None = None,
    param_dtype: str | None = None,
    progress: bool = True,
) -> tuple[Any, Any]:
    """(model, tokenizer or None) of a run dir (`load_run`, adapters merged) or of any `registry.load` source.

    Args:
      describe: what a run dir is (the module docstring).
      tokenizer: a tokenizer source to use instead of the model's own.
      overrides, mesh, seed: for `preset:` sources (see `registry.load`).
      dtype, param_dtype, progress: as `registry.load`.
    """
    source = os.fspath(source)
    path = os.path.expanduser(source)
    if os.path.isdir(path) and is_run_dir(path):
        if overrides:
            raise ConfigError(f"model overrides only apply to preset:<name> sources, not to the run dir {source}")
        trained = load_run(path, describe=describe, dtype=dtype, param_dtype=param_dtype, progress=progress)
        model, own = trained.model, trained.tokenizer
    else:
        model, own = registry.load(source, dtype=dtype, param_dtype=param_dtype, seed=seed, progress=progress,
                                   overrides=overrides, mesh=mesh)
    return model, (registry.load_tokenizer(tokenizer) if tokenizer else own)


def load_run(
    run_dir: str,
    *,
    describe: Describe,
    step: int | None = None,
    merge: bool = True,
    fallback: bool = True,
    dtype: str | None = None,
    param_dtype: str | None = None,
    progress: bool = True,
    say: Callable[[str], None] | None = None,
) -> TrainedModel:
    """The model a training run trained (see the module docstring).

    Args:
      run_dir: the run's train.run_dir.
      describe: what a run dir is: its command and where it keeps its model (the module docstring).
      step: a checkpoint step (default: the newest intact one).
      merge: fold LoRA adapters (and a QLoRA base) into plain weights; False keeps the adapters (export --adapters).
      fallback: with `step` None, read the newest checkpoint that is intact, after a line naming each damaged one
        skipped; False: a damaged newest checkpoint is an error naming the intact steps (an export says which
        step it holds, so it does not pass over one silently).
      dtype, param_dtype, progress: as `registry.load`, for the base model.
      say: where the one-line notes go (a skipped damaged checkpoint); default stderr.

    Raises:
      RunHasNoModel: no model can be made of the run (yet); the message says which command makes one.
      CheckpointError: `step` is not in the run, or no checkpoint of it reads.
    """
    say = say or (lambda text: print(text, file=sys.stderr))
    shape_source(run_dir, describe=describe)  # the chain of runs is sound (no cycle, no run without a model) first
    kind = describe(run_dir)
    raw = _model_run_config(run_dir, kind)
    layout = kind.model
    if step is not None and layout.kept in _FINAL_FOLDERS:
        raise ConfigError(f"{run_dir}'s model is the {layout.folder}/ folder it writes at its end, not a checkpoint "
                          "step; drop --step")
    if layout.kept == "folder":
        model, tokenizer = registry.load(_final_folder(run_dir, kind), dtype=dtype, param_dtype=param_dtype,
                                         progress=progress)
        return TrainedModel(model, tokenizer, {}, None)
    spec = dict(raw.get("model") or {})
    if layout.kept == "adapters":
        if not raw.get("lora"):
            raise RunHasNoModel(
                f"{run_dir} is a full-weight run with no model of its own: {layout.note}, and only a LoRA run "
                f"writes its adapters ({layout.folder}/); train it with lora set, or take the model it started "
                f"from, {spec.get('source')}"
            )
        return _from_adapters(run_dir, spec, kind, merge=merge, dtype=dtype, param_dtype=param_dtype,
                              progress=progress, describe=describe)
    return _from_checkpoint(run_dir, raw, spec, kind.command_line(run_dir), step=step, merge=merge,
                            fallback=fallback, dtype=dtype, param_dtype=param_dtype, progress=progress, say=say,
                            describe=describe)


def _model_run_config(run_dir: str, kind: RunKind) -> dict[str, Any]:
    """The run's config; a `RunHasNoModel` for a run that keeps no model (a reward model has no policy)."""
    raw = run_config(run_dir)
    if kind.model.kept == "none":
        source = (raw.get("model") or {}).get("source")
        raise RunHasNoModel(f"{run_dir} is a {kind.command} run: "
                            + kind.model.note.format(run_dir=run_dir, source=source))
    return raw


def _final_folder(run_dir: str, kind: RunKind) -> str:
    """The Hugging Face folder a "folder" run writes its model to when it finishes."""
    folder = os.path.join(run_dir, kind.model.folder)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise RunHasNoModel(f"{run_dir} has no {kind.model.folder}/ folder yet: {kind.model.note}; finish it with "
                            f"`{kind.command_line(run_dir)}`")
    return folder


def _check_chain(run_dir: str, chain: tuple[str, ...]) -> tuple[str, ...]:
    """`chain` with `run_dir` added; a run whose model.source leads back to itself is an error."""
    where = os.path.realpath(run_dir)
    if where in chain:
        raise ConfigError(f"model.source of the run in {run_dir} leads back to itself: " + " -> ".join([*chain, where]))
    return (*chain, where)


def shape_source(run_dir: str, *, describe: Describe, _chain: tuple[str, ...] = ()) -> tuple[str, dict[str, Any]]:
    """(model source, preset overrides) whose config is the shape of the model `load_run(run_dir)` gives, without
    reading weights: LoRA adds no shape, so it is the run's starting model (a chain of runs followed to its
    start), or the folder a "folder" run wrote."""
    chain = _check_chain(run_dir, _chain)
    kind = describe(run_dir)
    raw = _model_run_config(run_dir, kind)
    if kind.model.kept == "folder":
        return _final_folder(run_dir, kind), {}
    spec = raw.get("model") or {}
    source = str(spec.get("source") or "")
    path = os.path.expanduser(source)
    if os.path.isdir(path) and is_run_dir(path):
        return shape_source(path, describe=describe, _chain=chain)
    return source, dict(spec.get("overrides") or {})


def _base(run_dir: str, spec: Mapping[str, Any], *, seed: int, dtype: str | None, param_dtype: str | None,
          progress: bool, describe: Describe, shapes_only: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer) the run started from: its model section, a run dir in turn when it names one.

    The tokenizer is the run's own `tokenizer/` folder when it wrote one (the model section's is then not loaded),
    else the model section's `tokenizer`, else the source's. `shapes_only`: the caller restores every weight from
    the checkpoint, so a `preset:` source (whose weights would be random draws) is built as shapes only
    (`registry.abstract_preset`): its random initialisation would be thrown away."""
    source = str(spec.get("source") or "")
    if not source:
        raise CheckpointError(f"{os.path.join(run_dir, RUN_CONFIG_FILE)} names no model.source")
    path = os.path.expanduser(source)
    shapes = (registry.abstract_preset(source, dtype=dtype, param_dtype=param_dtype,
                                       overrides=spec.get("overrides") or None) if shapes_only else None)
    if shapes is not None:
        model, own = shapes, None
    elif os.path.isdir(path) and is_run_dir(path):
        trained = load_run(path, describe=describe, dtype=dtype, param_dtype=param_dtype, progress=progress)
        model, own = trained.model, trained.tokenizer
    else:
        model, own = registry.load(source, dtype=dtype, param_dtype=param_dtype, seed=seed, progress=progress,
                                   overrides=spec.get("overrides") or None)
    folder = os.path.join(run_dir, "tokenizer")
    if os.path.isdir(folder):
        return model, registry.load_tokenizer(folder)
    tokenizer = spec.get("tokenizer")
    return model, (registry.load_tokenizer(tokenizer) if tokenizer else own)


def merged(model: Any) -> Any:
    """`model` with adapters and a quantized base folded into plain weights (unchanged when it has neither)."""
    from flax import nnx

    from tempax.models.lora import has_adapters, merge_lora
    from tempax.models.quant import QuantizedLinear

    if has_adapters(model) or any(isinstance(m, QuantizedLinear) for _, m in nnx.iter_modules(model)):
        return merge_lora(model)
    return model


def _from_adapters(run_dir: str, spec: Mapping[str, Any], kind: RunKind, *, merge: bool, dtype: str | None,
                   param_dtype: str | None, progress: bool, describe: Describe) -> TrainedModel:
    from tempax.models.lora import load_adapters

    folder = os.path.join(run_dir, kind.model.folder)
    if not os.path.isfile(os.path.join(folder, "adapter_config.json")):
        raise RunHasNoModel(f"{run_dir} has no {kind.model.folder}/ yet: {kind.model.note}, and a LoRA run writes "
                            f"its adapters there when it finishes; finish it with `{kind.command_line(run_dir)}`")
    model, tokenizer = _base(run_dir, spec, seed=0, dtype=dtype, param_dtype=param_dtype, progress=progress,
                             describe=describe)
    model = load_adapters(model, folder)
    return TrainedModel(merged(model) if merge else model, tokenizer, {"trainable": "adapters"}, None)


def _from_checkpoint(run_dir: str, raw: Mapping[str, Any], spec: Mapping[str, Any], command: str, *,
                     step: int | None, merge: bool, fallback: bool, dtype: str | None, param_dtype: str | None,
                     progress: bool, say: Callable[[str], None], describe: Describe) -> TrainedModel:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from tempax.configlib import from_dict
    from tempax.models.lora import LoraConfig, lora_filter
    from tempax.train.checkpoint import Checkpointer, DamagedCheckpoint
    from tempax.train.state import ModelParts

    ckpt_dir = os.path.join(run_dir, "checkpoints")
    no_model = (f"{run_dir} has no checkpoint yet: its run has not saved a step; train it with `{command}` "
                "(it resumes there), then pass the run dir again")
    if not os.path.isdir(ckpt_dir):
        raise RunHasNoModel(no_model)
    checkpointer = Checkpointer(ckpt_dir, async_save=False, read_only=True)
    try:
        steps = sorted(checkpointer.all_steps(), reverse=True)
        if not steps:
            raise RunHasNoModel(no_model)
        if step is not None and step not in steps:
            raise CheckpointError(f"{ckpt_dir} has no checkpoint of step {step}; its steps: "
                                  + ", ".join(map(str, sorted(steps))))
        seed = int((raw.get("train") or {}).get("seed", 0))
        lora = from_dict(LoraConfig, raw["lora"]) if raw.get("lora") else None
        # A full run's checkpoint holds every weight: its base is needed as shapes only.
        model, tokenizer = _base(run_dir, spec, seed=seed, dtype=dtype, param_dtype=param_dtype,
                                 progress=progress, describe=describe, shapes_only=lora is None)
        if lora is None:
            parts, params = ModelParts.split(model, nnx.Param)
        else:  # the adapters' shapes, traced: nothing is drawn for adapters that the checkpoint replaces
            params = jax.eval_shape(lambda: ModelParts.split(_adapted(model, lora), lora_filter)[1])
        abstract = {k: jax.ShapeDtypeStruct(v.shape, jnp.float32) for k, v in params.items()}
        damaged: list[str] = []
        for candidate in [step] if step is not None else steps:
            try:
                meta = checkpointer.read_meta(candidate)
                _check_keys(meta, params, ckpt_dir, command)
                restored = checkpointer.restore_params(abstract, candidate, say=say)
            except DamagedCheckpoint as e:
                if step is not None or not fallback:
                    intact = [s for s in checkpointer.intact_steps({"params": abstract, "meta": {}},
                                                                   read_params=abstract) if s != e.step]
                    way_out = (f"intact checkpoints: {', '.join(map(str, intact))}; choose one with --step "
                               f"{intact[0]}" if intact else "no other checkpoint of this run is intact")
                    raise CheckpointError(f"{e}; {way_out}") from None
                damaged.append(str(e))
                say(f"skipping checkpoint step {candidate} of {run_dir}: {e}")
                continue
            break
        else:
            raise CheckpointError(f"no checkpoint of {run_dir} reads: " + "; ".join(damaged)
                                  + f". Train it again with `{command}` in a new train.run_dir (the damaged steps stay where they are)")
    finally:
        checkpointer.close()
    if lora is None:
        model = parts.merge({k: v.astype(params[k].dtype) for k, v in restored.items()})
        return TrainedModel(merged(model) if merge else model, tokenizer, meta, candidate)
    return TrainedModel(_with_adapters(model, lora, restored, merge=merge), tokenizer, meta, candidate)


def _adapted(base: Any, lora: Any) -> Any:
    """`base` with adapters where `lora` puts them; their random draws are placeholders for the checkpoint's."""
    from flax import nnx

    from tempax.models.lora import apply_lora

    return apply_lora(base, lora, rngs=nnx.Rngs(0))


def _with_adapters(base: Any, lora: Any, adapters: Mapping[str, Any], *, merge: bool) -> Any:
    """`base` with the `lora` adapters holding the checkpoint's `adapters` ({key: float32 array}), folded in when
    `merge`, as one compiled program: the adapters' placeholder draws are dead code there, the merge is compiled
    once instead of dispatched as an eager operation per weight and step, and `base` is donated (it belongs to the
    caller's load alone), so the weights it keeps are not copied. The same weights, bit for bit, as applying,
    restoring and merging eagerly (tests/train/test_run_model.py)."""
    from flax import nnx

    from tempax.models.lora import lora_filter
    from tempax.train.state import ModelParts

    def build(base: Any, adapters: Mapping[str, Any]) -> Any:
        parts, params = ModelParts.split(_adapted(base, lora), lora_filter)
        model = parts.merge({k: adapters[k].astype(params[k].dtype) for k in params})
        return merged(model) if merge else model

    return nnx.jit(build, donate_argnums=0)(base, dict(adapters))


def _check_keys(meta: Mapping[str, Any], params: Mapping[str, Any], ckpt_dir: str, command: str) -> None:
    saved_keys = meta.get("keys")
    if saved_keys is not None and sorted(saved_keys) != sorted(params):
        raise CheckpointError(
            f"the checkpoint in {ckpt_dir} holds {len(saved_keys)} arrays but the model its config.yaml describes "
            f"has {len(params)} trainable ones; config.yaml and the checkpoint disagree (the run was trained by "
            f"`{command}`?)"
        )
