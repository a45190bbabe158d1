"""A run's checkpoint (or any model) written for other tools: a Hugging Face folder or one llama.cpp GGUF file,
each with the model card of `tempax.export.model_card`.

SOURCE is a training run's directory or any model source `tempax.load` takes (a Hugging Face folder, a .gguf
file, a registered name, a Hub id, `preset:<name>`). For a run, the model it trained is rebuilt by
`tempax.train.run_model.load_run` (its `config.yaml`: model source, LoRA/QLoRA; the trainable arrays of the
latest, or `step`, checkpoint) and LoRA adapters folded into the weights (`W + alpha/r * A B`, a QLoRA base
dequantized first). A damaged latest checkpoint is an error naming the intact steps rather than a silent older
export.

OUT is then a Hugging Face folder (config.json + safetensors + tokenizer + a README.md model card + the run's
recipe as tempax_config.yaml), loadable by `transformers.AutoModelForCausalLM.from_pretrained(OUT)` and by
`tempax.load(OUT)`; or, with `gguf=True` (or an OUT ending in .gguf), one GGUF file holding the weights in `quant`
f32|f16|bf16|q8_0|q4_0 (default f16), the tokenizer and the model card as `general.*` metadata
(`tempax.models.gguf_export`). `adapters_only` writes a run's adapters alone in PEFT layout.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from tempax.errors import ConfigError
from tempax.export import model_card
from tempax.models.gguf_export import check_exportable, save_gguf
from tempax.models.registry import is_run_dir, load

# The model-loading modules (JAX, Orbax) are imported in `export` itself: `tempax export --help` stays light.


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr)


def export(source: str, out: str, *, step: int | None = None, dtype: str | None = None, adapters_only: bool = False,
           gguf: bool = False, quant: str | None = None, command: str | None = None,
           warn: Callable[[str], None] = _to_stderr) -> str:
    """Writes OUT (see the module docstring) and returns its path. `command` is the command line that repeats
    this export (the card quotes it); `warn` receives what the user should know about a file that was written
    anyway (a GGUF without a tokenizer)."""
    from tempax.models.lora import has_adapters, save_adapters
    from tempax.train.run_model import load_run, merged

    gguf = gguf or out.endswith(".gguf")
    if quant is not None and not gguf:
        raise ConfigError("--quant applies to GGUF files; add --gguf (or name OUT *.gguf)")
    if gguf and (adapters_only or dtype):
        raise ConfigError("--gguf writes the merged model in --quant's type; drop --adapters / --dtype")
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
        save_adapters(model, out, base_model_name_or_path=meta.get("model_source"))
        if tokenizer is not None:
            tokenizer.hf.save_pretrained(out)
        return out
    model = merged(model)
    card = model_card.gather(source=source, run_dir=run_dir, export_command=command)
    if gguf:
        check_exportable(model.config)  # before the warning below: a refused model is the one thing to say
        if tokenizer is None:
            warn(f"tempax export: {source} has no tokenizer, so the GGUF carries none and llama.cpp will not run it; "
                 "export a run or a model with a tokenizer")

        return save_gguf(model, out, tokenizer=tokenizer, quant=quant or "f16", metadata=model_card.gguf_metadata(card))
    from tempax.models.hf_io import save_hf_checkpoint

    save_hf_checkpoint(model, out, tokenizer=tokenizer, dtype=dtype)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(model_card.readme(card))
    if card.recipe:
        with open(os.path.join(out, "tempax_config.yaml"), "w") as f:
            f.write(card.recipe)
    return out
