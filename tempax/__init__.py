"""tempax: post-training for large language models in JAX.

`tempax.load(source)` returns `(model, tokenizer)` for a registered name (`smollm2-135m-instruct`), a `.gguf` file,
a Hugging Face checkpoint folder, a Hub repo id or `preset:<name>` (random init); `tempax.load_model` and
`tempax.load_tokenizer` return one of the two. `tempax.train(command, recipe, overrides)` runs a training command
as `tempax COMMAND --config RECIPE KEY=VALUE ...` does and returns its result. They are imported on first use so
`import tempax` stays light.
"""

import sys
import types
from typing import Any, Sequence

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


class _TrainingPackage(types.ModuleType):
    """`tempax.train` once the training layer's package of that name is imported: still the package, and callable
    as the function `tempax.train` above."""

    def __call__(self, command: str, recipe: str | None = None, overrides: Sequence[str] = (),
                 **main_options: Any) -> Any:
        from tempax.algorithms import registry as algorithm_registry

        return algorithm_registry.train(command, recipe, overrides, **main_options)


class _Package(types.ModuleType):
    """The `tempax` package. Importing a submodule binds it as an attribute of its parent, so importing the
    package `tempax.train` (the training loop, which every run imports) would replace the function `tempax.train`
    with a module, and a second `tempax.train(...)` in one process would fail; that package is made callable as
    the function instead."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY_TRAINING and isinstance(value, types.ModuleType):
            value.__class__ = _TrainingPackage
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
