"""A run's checkpoint (or any model) written for other tools: a Hugging Face folder or one llama.cpp GGUF file,
each with the model card of `tempax.export.model_card`.

`export` says what SOURCE and OUT may be; nothing the user has is replaced unasked (`check_destination`), and OUT
is written whole under a temporary name and moved into place at the end (`write_whole`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Callable

from tempax.errors import ConfigError
from tempax.export import model_card
from tempax.models.gguf_export import check_exportable, save_gguf
from tempax.models.registry import is_run_dir, load

# The model-loading modules (JAX, Orbax) are imported in `export` itself: `tempax export --help` stays light.


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr)


# What a folder an export wrote holds: one of these, and files only.
_EXPORT_MARKERS = ("config.json", "adapter_config.json")


def _listing(names: list[str], n: int = 4) -> str:
    shown = ", ".join(sorted(names)[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def check_destination(source: str, out: str, *, gguf: bool, overwrite: bool) -> None:
    """Refuses an OUT whose writing would replace what the user has.

    Nothing the user has is replaced unasked: an existing OUT (a file, or a folder that is not empty) is refused,
    before the model loads, unless `overwrite` (`--overwrite`) is given, and even then only a file or a folder of
    model files that an export writes (no subfolders; a `config.json` or `adapter_config.json` among them) is
    replaced, never SOURCE or a folder holding it. OUT is written whole under a temporary name beside it and moved
    into place at the end, so a failed or interrupted export leaves the old OUT (or none) as it was.

    Raises:
      ConfigError: OUT is SOURCE or holds it; OUT is a folder and a GGUF file is asked for; OUT exists (a file, or
        a folder that is not empty) and `overwrite` is false; or `overwrite` is true but OUT is a folder an export
        did not write.
    """
    path = os.path.abspath(os.path.expanduser(out))
    src = os.path.abspath(os.path.expanduser(source))
    if os.path.exists(src) and (path == src or src.startswith(path.rstrip(os.sep) + os.sep)):
        raise ConfigError(f"OUT {out} is SOURCE {source} or holds it; the export would replace what it reads. "
                          "Name another OUT")
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        names = os.listdir(path)
        if gguf:
            raise ConfigError(f"OUT {out} is a folder, and a GGUF export is one file; name a file in it, ending "
                              "in .gguf")
        if not names:
            return
        if not overwrite:
            raise ConfigError(f"OUT {out} is a folder that is not empty ({_listing(names)}); exporting into it would "
                              "mix files. Name a new folder, or add --overwrite to replace it")
        subfolders = [n for n in names if os.path.isdir(os.path.join(path, n))]
        if subfolders or not set(names) & set(_EXPORT_MARKERS):
            raise ConfigError(f"OUT {out} holds more than an exported model ({_listing(subfolders or names)}); "
                              "--overwrite replaces only a folder an export wrote. Name a new folder")
        return
    if not overwrite:
        kind = "one GGUF file" if gguf else "a Hugging Face folder (--gguf writes one GGUF file)"
        raise ConfigError(f"OUT {out} exists; the export writes {kind} there. Name a new path, or add --overwrite "
                          "to replace it")


def write_whole(out: str, write: Callable[[str], object]) -> str:
    """Calls `write(path)` for a path beside OUT (a file or folder of OUT's name in a temporary folder of OUT's
    folder, so on the same file system), then moves the result to OUT: a rename, replacing a file in one step and
    an old folder by moving it aside first. A failure leaves OUT as it was and removes what was written."""
    path = os.path.abspath(os.path.expanduser(out))
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".tempax-export-", dir=parent)
    try:
        fresh = os.path.join(staging, os.path.basename(path))
        write(fresh)
        if _one_rename(fresh, path):
            os.replace(fresh, path)
        else:
            old = os.path.join(staging, "replaced")
            os.rename(path, old)  # the old OUT stays whole, beside, until the new one is in place
            try:
                os.rename(fresh, path)
            except OSError:
                os.rename(old, path)
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _one_rename(fresh: str, path: str) -> bool:
    """Whether one rename puts `fresh` at `path`: nothing there, a file over a file, a folder over an empty one."""
    if not os.path.lexists(path):
        return True
    path_is_folder = os.path.isdir(path) and not os.path.islink(path)
    if os.path.isdir(fresh):
        return path_is_folder and not os.listdir(path)
    return not path_is_folder


def export(source: str, out: str, *, step: int | None = None, dtype: str | None = None, adapters_only: bool = False,
           gguf: bool = False, quant: str | None = None, command: str | None = None, overwrite: bool = False,
           warn: Callable[[str], None] = _to_stderr) -> str:
    """Writes OUT and returns its path. `command` is the command line that repeats this export (the card quotes
    it); `overwrite` lets an existing OUT be replaced (`check_destination`); `warn` receives what the user should
    know about a file that was written anyway (a GGUF without a tokenizer).

    SOURCE is a training run's directory or any model source `tempax.load` takes (a Hugging Face folder, a .gguf
    file, a registered name, a Hub id, `preset:<name>`). For a run, the model it trained is rebuilt by
    `tempax.algorithms.run_dirs.load_run` (its `config.yaml`: model source, LoRA/QLoRA; the trainable arrays of the
    latest, or `step`, checkpoint) and LoRA adapters folded into the weights (`W + alpha/r * A B`, a QLoRA base
    dequantized first). A damaged latest checkpoint is an error naming the intact steps rather than a silent older
    export.

    OUT is then a Hugging Face folder (config.json + safetensors + tokenizer + a README.md model card + the run's
    recipe as tempax_config.yaml), loadable by `transformers.AutoModelForCausalLM.from_pretrained(OUT)` and by
    `tempax.load(OUT)`; or, with `gguf=True` (or an OUT ending in .gguf), one GGUF file holding the weights in `quant`
    f32|f16|bf16|q8_0|q4_0 (default f16), the tokenizer and the model card as `general.*` metadata
    (`tempax.models.gguf_export`). `adapters_only` writes a run's adapters alone in PEFT layout.
    """
    from tempax.models.lora import has_adapters, save_adapters
    from tempax.algorithms.run_dirs import load_run
    from tempax.train.run_model import merged

    gguf = gguf or out.endswith(".gguf")
    if quant is not None and not gguf:
        raise ConfigError("--quant applies to GGUF files; add --gguf (or name OUT *.gguf)")
    if gguf and (adapters_only or dtype):
        raise ConfigError("--gguf writes the merged model in --quant's type; drop --adapters / --dtype")
    check_destination(source, out, gguf=gguf, overwrite=overwrite)  # before the (slow) load
    run_dir = source if os.path.isdir(source) and is_run_dir(source) else None
    if run_dir is not None:
        trained = load_run(run_dir, step=step, merge=False, fallback=False)
        model, tokenizer, meta = trained.model, trained.tokenizer, trained.meta
    else:
        if step is not None or adapters_only:
            raise ConfigError(f"{source} is not a training run (no config.yaml); --step and --adapters need one")

        model, tokenizer = load(source)
        meta = {}
    if adapters_only:
        if not has_adapters(model):
            raise ConfigError(f"{run_dir} trained every weight (no adapters); export without --adapters")
        def write_adapters(folder: str) -> None:
            save_adapters(model, folder, base_model_name_or_path=meta.get("model_source"))
            if tokenizer is not None:
                tokenizer.hf.save_pretrained(folder)

        return write_whole(out, write_adapters)
    model = merged(model)
    card = model_card.gather(source=source, run_dir=run_dir, export_command=command)
    if gguf:
        check_exportable(model.config)  # before the warning below: a refused model is the one thing to say
        if tokenizer is None:
            warn(f"tempax export: {source} has no tokenizer, so the GGUF carries none and llama.cpp will not run it; "
                 "export a run or a model with a tokenizer")

        return write_whole(out, lambda path: save_gguf(model, path, tokenizer=tokenizer, quant=quant or "f16",
                                                       metadata=model_card.gguf_metadata(card)))
    from tempax.models.hf_io import save_hf_checkpoint

    def write_folder(folder: str) -> None:
        save_hf_checkpoint(model, folder, tokenizer=tokenizer, dtype=dtype)
        with open(os.path.join(folder, "README.md"), "w") as f:
            f.write(model_card.readme(card))
        if card.recipe:
            with open(os.path.join(folder, "tempax_config.yaml"), "w") as f:
                f.write(card.recipe)

    return write_whole(out, write_folder)
