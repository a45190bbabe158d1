"""QLoRA: NF4 / int8 blockwise quantization (hand-computed codes, error bound, memory) and adapters on a 4-bit base."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tempax.errors import ConfigError
from tempax.models.lora import (
    LoraConfig,
    apply_lora,
    disable_adapters,
    load_adapters,
    lora_filter,
    lora_layers,
    merge_lora,
    save_adapters,
)
from tempax.models.quant import (
    NF4_LEVELS,
    QuantizedLinear,
    QuantizedWeight,
    dequantize_blockwise,
    quantize_blockwise,
    quantized_bytes,
    quantized_matmul,
)
from tests.kit.models import random_ids, tiny_tempax_model

QCFG = LoraConfig(rank=4, alpha=8.0, quantize_base="nf4")


@nnx.jit
def _logits(model, tokens):
    return model(tokens)[0]


def _randomize_b(model, seed: int = 0, scale: float = 0.2):
    for i, (_, layer) in enumerate(lora_layers(model)):
        key = jax.random.fold_in(jax.random.key(seed), i)
        layer.lora_b.set_value(jax.random.normal(key, layer.lora_b.shape) * scale)
    return model


@pytest.fixture(scope="module")
def base():
    return tiny_tempax_model("qwen2")  # q/k/v biases: they must survive quantization unchanged


@pytest.fixture(scope="module")
def tokens():
    return jnp.asarray(random_ids((2, 9), seed=2))


# --------------------------------------------------------------------------------------------------------------
def test_nf4_levels():
    """16 ascending levels spanning [-1, 1] with an exact zero (QLoRA Appendix E)."""
    assert NF4_LEVELS.shape == (16,) and np.all(np.diff(NF4_LEVELS) > 0)
    assert NF4_LEVELS[0] == -1.0 and NF4_LEVELS[15] == 1.0 and NF4_LEVELS[7] == 0.0


def test_nf4_codes_hand_computed():
    """One block of 4: absmax = 1.0. Nearest levels: 0.5 -> 0.4407 (code 12; |0.5 - 0.4407| = 0.059 <
    |0.5 - 0.5626| = 0.063), -1.0 -> code 0, 0.25 -> 0.2461 (code 10), 0.0 -> code 7.
    Packed two per byte, even row in the low nibble: 12 | 0 << 4 = 12 and 10 | 7 << 4 = 122."""
    w = jnp.array([[0.5], [-1.0], [0.25], [0.0]])
    codes, scale = quantize_blockwise(w, kind="nf4", block_size=4)
    np.testing.assert_array_equal(np.asarray(codes), [[12], [122]])
    np.testing.assert_array_equal(np.asarray(scale), [[1.0]])
    got = dequantize_blockwise(codes, scale, kind="nf4", in_features=4)
    np.testing.assert_allclose(np.asarray(got)[:, 0], [0.44070983, -1.0, 0.24611230, 0.0], rtol=1e-6)


def test_int8_codes_hand_computed():
    """absmax 2.0: codes round(w / 2 * 127) = [64 (63.5 rounds to even), -127, 32 (31.75), 0];
    dequantized 2 * code / 127 = [1.00787, -2, 0.50394, 0]."""
    w = jnp.array([[1.0], [-2.0], [0.5], [0.0]])
    codes, scale = quantize_blockwise(w, kind="int8", block_size=4)
    np.testing.assert_array_equal(np.asarray(codes)[:, 0], [64, -127, 32, 0])
    got = dequantize_blockwise(codes, scale, kind="int8", in_features=4)
    np.testing.assert_allclose(np.asarray(got)[:, 0], [128 / 127, -2.0, 64 / 127, 0.0], rtol=1e-6)


def test_rows_are_padded_to_whole_blocks():
    """96 input rows with blocks of 64 -> 2 blocks (rows 96..127 are zero padding); an all-zero block has scale 0."""
    w = jnp.zeros((96, 3)).at[:64].set(1.0)
    codes, scale = quantize_blockwise(w, kind="nf4", block_size=64)
    assert codes.shape == (64, 3) and scale.shape == (2, 3)
    np.testing.assert_array_equal(np.asarray(scale), [[1.0] * 3, [0.0] * 3])
    np.testing.assert_array_equal(np.asarray(dequantize_blockwise(codes, scale, kind="nf4", in_features=96)), w)
    with pytest.raises(ConfigError, match="even"):
        quantize_blockwise(w, kind="nf4", block_size=3)


def test_quantization_error_bound():
    """Gaussian weights, blocks of 64: NF4's relative RMS error is about 0.09 (16 levels spread over +-absmax,
    which for 64 normal samples sits near 2.4 sigma), int8's about 0.006; bounds 0.1 and 0.01."""
    w = jax.random.normal(jax.random.key(0), (512, 256)) * 0.02
    for kind, bound in (("nf4", 0.1), ("int8", 0.01)):
        codes, scale = quantize_blockwise(w, kind=kind, block_size=64)
        back = dequantize_blockwise(codes, scale, kind=kind, in_features=512)
        rel = float(jnp.sqrt(jnp.mean((back - w) ** 2) / jnp.mean(w**2)))
        assert rel < bound, (kind, rel)


def test_quantized_matmul_gradient_matches_autodiff():
    """The custom backward (kernel recomputed from codes) gives the same input gradient as differentiating
    x @ dequantize(codes, scale) directly."""
    w = jax.random.normal(jax.random.key(1), (128, 32))
    x = jax.random.normal(jax.random.key(2), (5, 128))
    codes, scale = quantize_blockwise(w, kind="nf4", block_size=64)
    dense = dequantize_blockwise(codes, scale, kind="nf4", in_features=128)
    ours = jax.grad(lambda x: jnp.sum(jnp.sin(quantized_matmul(x, codes, scale, "nf4", 128, jnp.float32))))(x)
    plain = jax.grad(lambda x: jnp.sum(jnp.sin(x @ dense)))(x)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(plain), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------------------
@pytest.mark.heavy
def test_weight_memory_is_about_a_quarter_of_bfloat16():
    """Every projection kernel is quantized. Per weight: 4 bits of code + 32 bits of scale per 64 weights =
    4.5 bits; bfloat16 is 16 bits: 4.5 / 16 = 0.28125. (Input sizes 64 and 128 need no padding.)
    The bytes are real device bytes: two codes share one uint8."""
    base = tiny_tempax_model("llama", intermediate_size=128)
    model = apply_lora(base, QCFG, rngs=nnx.Rngs(0))
    kernels = [m.kernel for _, m in nnx.iter_modules(base) if isinstance(m, nnx.Linear) and m is not base.lm_head]
    bf16_bytes = sum(k.size * 2 for k in kernels)
    stored = [v[...] for _, v in nnx.iter_graph(model) if isinstance(v, QuantizedWeight)]
    on_device = sum(x.on_device_size_in_bytes() for x in stored)
    assert on_device == quantized_bytes(model)
    assert quantized_bytes(model) / bf16_bytes == pytest.approx(0.28125)
    assert all(isinstance(layer.base_layer, QuantizedLinear) for _, layer in lora_layers(model))


def test_qlora_structure_and_frozen_float_parts(base):
    """All 7 projections are quantized; only the targeted ones get adapters (float32); biases stay float."""
    model = apply_lora(base, LoraConfig(rank=4, alpha=8.0, quantize_base="nf4", target_modules=("q_proj",)),
                       rngs=nnx.Rngs(0))
    attn = model.layers.self_attn
    assert isinstance(attn.k_proj, QuantizedLinear) and isinstance(model.layers.mlp.down_proj, QuantizedLinear)
    assert attn.q_proj.lora_a[...].dtype == jnp.float32 and attn.q_proj.lora_b[...].dtype == jnp.float32
    assert attn.k_proj.codes.shape[0] == base.config.num_layers  # each layer's kernel quantized on its own
    base_bias = base.layers.self_attn.k_proj.bias[...]
    np.testing.assert_array_equal(np.asarray(attn.k_proj.bias[...]), np.asarray(base_bias))
    assert not [p for p, v in nnx.iter_graph(model) if isinstance(v, nnx.Param) and p[-1] == "kernel" and "layers" in p]


@pytest.mark.heavy
def test_qlora_zero_b_and_disabled_adapters_equal_the_dequantized_base(base, tokens):
    """B = 0, and adapters switched off with B != 0, both give the quantized base; merging that base
    (dequantized float kernels) gives the same logits within float32 rounding. Switched-off adapters are another
    program than zero ones, which XLA:CPU may fuse differently (a bias folded into its product or not): equal
    to float32 rounding (seen 1.5e-7), not bit for bit."""
    model = apply_lora(base, QCFG, rngs=nnx.Rngs(0))
    zero_b = np.asarray(_logits(model, tokens))
    dequantized = np.asarray(_logits(merge_lora(model), tokens))
    np.testing.assert_allclose(zero_b, dequantized, atol=1e-5, rtol=0)
    _randomize_b(model)
    assert np.abs(np.asarray(_logits(model, tokens)) - zero_b).max() > 1e-2
    with disable_adapters(model):
        np.testing.assert_allclose(np.asarray(_logits(model, tokens)), zero_b, atol=1e-6, rtol=0)


@pytest.mark.heavy
def test_qlora_gradient_step_changes_adapters_only(base, tokens):
    model = apply_lora(base, QCFG, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=lora_filter)
    frozen_before = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Not(lora_filter)))]
    b_before = [np.asarray(layer.lora_b[...]) for _, layer in lora_layers(model)]

    @nnx.jit
    def step(model, optimizer, tokens):
        loss, grads = nnx.value_and_grad(
            lambda m: -jnp.mean(jax.nn.log_softmax(m(tokens)[0]).max(-1)), argnums=nnx.DiffState(0, lora_filter)
        )(model)
        optimizer.update(model, grads)
        return loss

    assert np.isfinite(float(step(model, optimizer, tokens)))
    frozen_after = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Not(lora_filter)))]
    assert len(frozen_after) == len(frozen_before)
    for before, after in zip(frozen_before, frozen_after):
        np.testing.assert_array_equal(before, after)
    for before, (_, layer) in zip(b_before, lora_layers(model)):
        assert not np.array_equal(before, np.asarray(layer.lora_b[...]))


def test_int8_base_is_close_to_the_float_base(base, tokens):
    model = apply_lora(base, LoraConfig(rank=4, alpha=8.0, quantize_base="int8"), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.asarray(_logits(model, tokens)), np.asarray(_logits(base, tokens)), atol=2e-2)


def test_qlora_adapters_round_trip(base, tokens, tmp_path):
    model = _randomize_b(apply_lora(base, QCFG, rngs=nnx.Rngs(0)))
    save_adapters(model, str(tmp_path))
    loaded = load_adapters(base, str(tmp_path), quantize_base="nf4")
    np.testing.assert_array_equal(np.asarray(_logits(loaded, tokens)), np.asarray(_logits(model, tokens)))


def test_qlora_merged_export_loads_in_transformers(base, tokens, tmp_path):
    """Merged kernels = dequantized NF4 + (alpha / r) A B; transformers reproduces the QLoRA logits (atol 1e-4)."""
    torch = pytest.importorskip("torch")
    import transformers

    from tempax.models.hf_io import save_hf_checkpoint

    model = _randomize_b(apply_lora(base, QCFG, rngs=nnx.Rngs(0)))
    save_hf_checkpoint(merge_lora(model), str(tmp_path))
    assert os.path.isfile(tmp_path / "model.safetensors")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    with torch.no_grad():
        expected = ref(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(np.asarray(_logits(model, tokens)), expected, atol=1e-4, rtol=0)
