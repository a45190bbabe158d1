import jax
import pytest
from flax import nnx

from tempax.models.decoder import Decoder
from tempax.models.weights import abstract_model
from tests.kit.models import TINY_FAMILIES, TINY_MOE_FAMILIES, tiny_config


@pytest.mark.parametrize("family", TINY_FAMILIES + TINY_MOE_FAMILIES)
def test_abstract_model_has_the_structure_of_the_whole_constructor(family):
    """Layer by layer (abstract_model) and in one trace: the same graph, and every parameter with the same
    shape, dtype and logical axis names (sliding / full layers of the Gemma families included)."""
    cfg = tiny_config(family)
    fast = nnx.split(abstract_model(cfg))
    whole = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    assert fast[0] == whole[0]

    def described(state):
        return [(path, var.get_value().shape, var.get_value().dtype, var.get_metadata().get("out_sharding"))
                for path, var in nnx.to_flat_state(state)]

    assert described(fast[1]) == described(whole[1])
    assert all(isinstance(v.get_value(), jax.ShapeDtypeStruct) for _, v in nnx.to_flat_state(fast[1]))
