"""Hugging Face checkpoints: config.json + safetensors (single file or sharded with an index), local or Hub.

Loading streams tensor by tensor into an abstract model; saving writes safetensors shards, config.json and,
when given, the tokenizer files, in a layout `transformers.AutoModelForCausalLM.from_pretrained` loads.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import Any, Callable, Iterator

import numpy as np

from tempax.errors import CheckpointError
from tempax.models.config import ModelConfig
from tempax.models.decoder import Decoder
from tempax.models.fused import fuse_tensors, split_fused_tensors
from tempax.models.weights import abstract_model, fill_params, iter_hf_tensors
from tempax.progress import on_terminal

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"


def resolve_checkpoint_dir(source: str) -> str:
    """A local folder, or a Hub repo id downloaded to the local cache (needs network the first time)."""
    if os.path.isdir(source):
        return source
    if os.path.exists(source):
        raise CheckpointError(f"{source} is a file, not a checkpoint folder (expected config.json + *.safetensors)")
    if source.count("/") != 1 or source.startswith((".", "/")):
        raise CheckpointError(
            f"checkpoint not found: {source!r} is neither a local folder nor a Hub repo id (owner/name)."
        )
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(
            source, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]
        )
    except Exception as e:  # network errors, missing repos, gated repos: all user-fixable
        raise CheckpointError(
            f"could not fetch {source!r} from the Hugging Face Hub ({type(e).__name__}: {e}). "
            "Check the repo id and your network, or pass a local folder."
        ) from e


def _safetensors_files(folder: str) -> list[str]:
    index = os.path.join(folder, SAFETENSORS_INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted(set(weight_map.values()))
        for name in files:
            if not os.path.isfile(os.path.join(folder, name)):
                raise CheckpointError(f"{index} lists {name}, which is not in {folder}")
        return [os.path.join(folder, n) for n in files]
    single = os.path.join(folder, SAFETENSORS_SINGLE)
    if os.path.isfile(single):
        return [single]
    found = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not found:
        raise CheckpointError(f"no *.safetensors weights in {folder}")
    return [os.path.join(folder, n) for n in found]


def _check_safetensors_header(path: str) -> None:
    """Fails early, with the file's name, on a truncated or corrupt file (safetensors' own error is opaque)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"{path} is truncated: {size} bytes, too short for a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            raise CheckpointError(f"{path} is truncated or corrupt: header claims {n} bytes, file has {size}")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise CheckpointError(f"{path} has a corrupt safetensors header: {e}") from e
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise CheckpointError(
            f"{path} is truncated: tensors need {8 + n + end} bytes but the file has {size}. Download it again."
        )


def _iter_safetensors(files: list[str]) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """(name, loader) for every tensor; loaders memory-map one tensor (bfloat16 through ml_dtypes)."""
    import ml_dtypes

    for path in files:
        _check_safetensors_header(path)
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        base = 8 + n
        dtypes = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
                  "I64": np.int64, "I32": np.int32, "U8": np.uint8, "I8": np.int8, "BOOL": np.bool_}
        for name, meta in header.items():
            if name == "__metadata__":
                continue

            def load(meta=meta, path=path, base=base) -> np.ndarray:
                start, end = meta["data_offsets"]
                dtype = dtypes.get(meta["dtype"])
                if dtype is None:
                    raise CheckpointError(f"{path}: tensor dtype {meta['dtype']} is not supported")
                if end == start:
                    return np.zeros(meta["shape"], dtype)
                mapped = np.memmap(path, dtype=dtype, mode="r", offset=base + start, shape=tuple(meta["shape"]))
                return np.array(mapped)

            yield name, load


def load_hf_checkpoint(
    source: str, *, param_dtype: str | None = None, dtype: str | None = None, progress: bool = True
) -> Decoder:
    """Loads a Hugging Face causal-LM checkpoint (folder or Hub id) into a tempax `Decoder`."""
    folder = resolve_checkpoint_dir(source)
    cfg = ModelConfig.from_json_file(os.path.join(folder, "config.json"))
    changes = {k: v for k, v in (("param_dtype", param_dtype), ("dtype", dtype)) if v}
    cfg = cfg.replace(**changes) if changes else cfg
    files = _safetensors_files(folder)
    total = sum(os.path.getsize(p) for p in files)
    bar = _progress_bar(total, f"loading {os.path.basename(os.path.normpath(folder))}", progress)
    model = abstract_model(cfg)
    try:
        fill_params(model, split_fused_tensors(_iter_safetensors(files), cfg), source=folder,
                    progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    return model


def _progress_bar(total_bytes: int, desc: str, enabled: bool) -> Any:
    # Only large files earn a bar; small test checkpoints stay quiet. Off a terminal (a log, a pipe) one plain line
    # says what is loading, instead of carriage-return frames.
    if not enabled or total_bytes < 200 * 2**20:
        return None
    if not on_terminal():
        print(f"{desc} ({total_bytes / 2**20:.0f} MiB)", file=sys.stderr, flush=True)
        return None
    from tqdm import tqdm

    return tqdm(total=total_bytes, unit="B", unit_scale=True, desc=desc, leave=False)


def save_safetensors(tensors: dict[str, np.ndarray], path: str, metadata: dict[str, str] | None = None) -> None:
    """`safetensors.numpy.save_file`, then the permissions of any file this process creates (0644 under the usual
    umask 022): safetensors writes through a private temporary file and keeps its 0600, so a shared or served
    checkpoint folder would hold weights no one else can read beside readable config and tokenizer files."""
    from safetensors.numpy import save_file

    save_file(tensors, path, metadata=metadata)
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    """The process's umask (`os.umask` can only be read by setting it, so it is set back at once)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def save_hf_checkpoint(
    model: Decoder,
    folder: str,
    *,
    tokenizer: Any = None,
    max_shard_bytes: int = 2 * 2**30,
    dtype: str | None = None,
) -> str:
    """Writes model.safetensors (sharded with an index past `max_shard_bytes`), config.json and tokenizer files."""
    os.makedirs(folder, exist_ok=True)
    cfg = model.config
    out_dtype = np.float32
    if (dtype or cfg.param_dtype) == "bfloat16":
        import ml_dtypes

        out_dtype = ml_dtypes.bfloat16
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in fuse_tensors(iter_hf_tensors(model), cfg):  # Phi-3's files fuse qkv and gate/up
        array = np.ascontiguousarray(array.astype(out_dtype))
        if size + array.nbytes > max_shard_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    if len(shards) == 1:
        save_safetensors(shards[0], os.path.join(folder, SAFETENSORS_SINGLE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_safetensors(shard, os.path.join(folder, fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in shard})
        with open(os.path.join(folder, SAFETENSORS_INDEX), "w") as f:
            json.dump({"metadata": {"total_size": sum(a.nbytes for s in shards for a in s.values())},
                       "weight_map": weight_map}, f, indent=2)
    hf = cfg.to_hf_config()
    if dtype:
        hf["torch_dtype"] = dtype
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    if tokenizer is not None:
        getattr(tokenizer, "hf", tokenizer).save_pretrained(folder)
    return folder
