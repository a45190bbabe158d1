"""tempax.train.trainable: what the trainer asks of a model (a training view and a memory profile), with the
default adapter for a decoder and a composite's own answers overridden by what a run adds."""

from __future__ import annotations

from flax import nnx

from tempax.train.trainable import MemoryProfile, Trainable, TrainableModel, as_trainable
from tests.kit.models import tiny_tempax_model


class Pair(nnx.Module):
    """A composite with a decoder under `backbone` and a scalar head, like a reward model."""

    def __init__(self):
        self.backbone = tiny_tempax_model("llama")
        self.head = nnx.Linear(4, 1, rngs=nnx.Rngs(0))


class OwnProfile:
    """A composite that answers both questions itself (a policy beside a critic)."""

    def training_view(self, *, remat, precision):
        return ("view", remat, precision)

    def memory_profile(self):
        return MemoryProfile(model="critic-config", tokens_per_row=100, trunks=2, held_bytes=5)


def test_a_decoder_gets_the_default_adapter_and_its_view_leaves_the_callers_model_alone():
    model = tiny_tempax_model("llama")
    adapter = as_trainable(model)
    assert isinstance(adapter, Trainable) and adapter.module is model
    view = adapter.training_view(remat="full", precision="fp32")
    assert view is not model and view.config.remat == "full" and model.config.remat != "full"
    assert view.embed_tokens.embedding[...] is model.embed_tokens.embedding[...]  # the same array, not a copy
    assert adapter.memory_profile() == MemoryProfile(model=model.config)


def test_a_composite_names_its_trunk_for_remat_and_the_profile():
    pair = Pair()
    adapter = Trainable(pair, trunks=("backbone",), logit_positions=0)
    view = adapter.training_view(remat="full", precision="fp32")
    assert view.backbone.config.remat == "full" and pair.backbone.config.remat != "full"
    assert adapter.memory_profile() == MemoryProfile(model=pair.backbone.config, logit_positions=0)


def test_what_a_run_adds_overrides_the_models_own_profile():
    """A GRPO row of one prompt and 8 completions: tokens_per_row set by the run; held_bytes replaced (not added);
    the composite's own trunks and model kept; an unset override (None / 0) keeps the composite's value."""
    own = OwnProfile()
    assert isinstance(own, TrainableModel) and as_trainable(own) is own
    adapter = Trainable(own, tokens_per_row=576, held_bytes=7)
    assert adapter.memory_profile() == MemoryProfile(model="critic-config", tokens_per_row=576, trunks=2,
                                                     held_bytes=7)
    assert Trainable(own).memory_profile() == own.memory_profile()
    assert adapter.training_view(remat="dots", precision="bf16") == ("view", "dots", "bf16")


def test_a_module_without_a_config_gets_no_plan():
    table = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    assert Trainable(table).memory_profile() == MemoryProfile(model=None)
