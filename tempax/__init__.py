"""tempax: post-training for large language models in JAX.

`tempax.load(source)` returns `(model, tokenizer)` for a registered name (`smollm2-135m-instruct`), a `.gguf` file,
a Hugging Face checkpoint folder, a Hub repo id or `preset:<name>` (random init); `tempax.load_model` and
`tempax.load_tokenizer` return one of the two. `tempax.train(command, recipe, overrides)` runs a training command
as `tempax COMMAND --config RECIPE KEY=VALUE ...` does and returns its result. They are imported on first use so
`import tempax` stays light.
"""

__version__ = "0.1.0"

_LAZY = {"load", "load_model", "load_tokenizer", "model_config", "inspect_model"}
_LAZY_TRAINING = {"train"}

__all__ = ["__version__", *sorted(_LAZY | _LAZY_TRAINING)]


def __getattr__(name: str):
    if name in _LAZY:
        from tempax.models import registry

        return getattr(registry, name)
    if name in _LAZY_TRAINING:
        from tempax.algorithms import registry as algorithm_registry

        return getattr(algorithm_registry, name)
    raise AttributeError(f"module 'tempax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY | _LAZY_TRAINING)
