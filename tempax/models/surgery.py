"""Model surgery: a smaller decoder made from a bigger one's weights.

`keep_layers(model, [0, 3, 6])` is a new `Decoder` holding the chosen transformer layers of `model` (in that
order), with the token embeddings, the final norm and the LM head copied: the usual starting point of a
distilled student of the same family (DistilBERT, Sanh et al. 2019, initialises its student from every second
teacher layer; Sreenivas et al. 2024, "LLM pruning and distillation in practice", drop whole layers of Llama 3.1
and recover with distillation). Each kept layer keeps its attention kind (full or sliding window) and its rotary
base, so a kept layer computes exactly what it computed in the teacher given the same input.

`layer_selection("every 3", 30)` turns the config spellings into indices.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from flax import nnx

from tempax.errors import ConfigError
from tempax.models.decoder import Decoder
from tempax.models.weights import abstract_model


def layer_selection(spec: str | Sequence[int], num_layers: int) -> tuple[int, ...]:
    """Layer indices of a selection: "all"; "every N" (0, N, 2N, ...); "first N"; "last N"; or a list of indices
    (negative ones count from the end). Raises `ConfigError` naming the spec when it selects nothing, repeats or
    goes out of range."""
    if isinstance(spec, str):
        words = spec.strip().lower().split()
        if words == ["all"]:
            return tuple(range(num_layers))
        if len(words) == 2 and words[0] in ("every", "first", "last") and words[1].isdigit() and int(words[1]) > 0:
            n = int(words[1])
            if words[0] == "every":
                return tuple(range(0, num_layers, n))
            if n > num_layers:
                raise ConfigError(f"keep_layers={spec!r}: the model has only {num_layers} layers")
            return tuple(range(n)) if words[0] == "first" else tuple(range(num_layers - n, num_layers))
        raise ConfigError(
            f"keep_layers={spec!r} is not a layer selection; write 'all', 'every N', 'first N', 'last N' or a list "
            "of layer indices like [0, 3, 6]"
        )
    indices = [int(i) + num_layers if int(i) < 0 else int(i) for i in spec]
    if not indices:
        raise ConfigError("keep_layers selects no layer; keep at least one")
    bad = [i for i in spec if not -num_layers <= int(i) < num_layers]
    if bad:
        raise ConfigError(f"keep_layers: {bad} out of range for a model with {num_layers} layers (0..{num_layers - 1})")
    if len(set(indices)) != len(indices):
        raise ConfigError(f"keep_layers lists a layer twice: {list(spec)}")
    return tuple(indices)


def keep_layers(model: Decoder, layers: Sequence[int]) -> Decoder:
    """A new `Decoder` with the transformer layers `layers` of `model` (indices into model.layers, in the order
    given) and copies of everything else (embeddings, final norm, LM head). `model` is unchanged; the arrays are
    shared, not duplicated (JAX arrays are immutable).

    Takes a plain model: LoRA adapters or a quantized base would be kept as they are only if the new model
    had them too, so they are refused (merge or drop adapters first).
    """
    cfg = model.config
    layers = layer_selection(list(layers), cfg.num_layers)
    if cfg.per_layer_input_size or cfg.kv_shared_layers:
        raise ConfigError(
            f"keep_layers cannot cut this {cfg.family} model: its per-layer inputs (per_layer_input_size="
            f"{cfg.per_layer_input_size}, tables over every layer) or its KV-shared layers (kv_shared_layers="
            f"{cfg.kv_shared_layers}, counted from the last layer) would no longer match the layers kept")
    new_cfg = cfg.replace(
        num_layers=len(layers),
        layer_types=tuple(cfg.layer_type(i) for i in layers) if cfg.layer_types else (),
    )
    graphdef, abstract_state = nnx.split(abstract_model(new_cfg))
    old = dict(nnx.to_flat_state(nnx.state(model)))
    new_paths = {tuple(path) for path, _ in nnx.to_flat_state(abstract_state)}
    extra = sorted(".".join(map(str, p)) for p in old if tuple(p) not in new_paths)
    if extra:
        raise ConfigError(
            f"keep_layers takes a plain decoder; this one has parts a plain one lacks ({', '.join(extra[:3])}"
            f"{', ...' if len(extra) > 3 else ''}): merge LoRA adapters or load the float model first"
        )
    chosen = np.asarray(layers)
    flat = []
    for path, var in nnx.to_flat_state(abstract_state):
        value = old[tuple(path)].get_value()
        flat.append((path, var.replace(value[chosen] if path[0] == "layers" else value)))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))
