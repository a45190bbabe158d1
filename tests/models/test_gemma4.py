"""Gemma 4 (text): value norms, a proportional rope on the full layers, full layers of their own attention shape,
values equal to keys, per-layer inputs, layer scalars and layers that attend to an earlier layer's keys and values.
Logits, padding, packing, caches, greedy generation and export are checked with every family on `tiny-gemma4`
(tests/models/test_parity.py, tests/generate/test_parity.py, tests/models/test_roundtrip.py); this file checks what
only Gemma 4 has, and that the switches tempax cannot run exactly are refused with the setting named. Its
mixture-of-experts block: tests/models/test_gemma4_moe.py."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax.errors import CheckpointError, ConfigError
from tempax.models.config import ModelConfig, RopeConfig
from tempax.models.decoder import Decoder, rope_inverse_frequencies
from tempax.models.hf_io import load_hf_checkpoint, save_hf_checkpoint
from tempax.models.weights import iter_hf_tensors
from tests.kit.models import as_multimodal_checkpoint, random_ids, tiny_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.needs_torch

TOL = 1e-4


def _text_config(**kw):
    """A tiny Gemma 4 text config.json as the published ones spell it: the full layers twice as wide per head, with
    one key/value head (num_global_key_value_heads, which transformers applies with attention_k_eq_v), and the
    KV-shared layers' MLP twice as wide (use_double_wide_mlp)."""
    base = dict(model_type="gemma4_text", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                num_global_key_value_heads=1, sliding_window=4,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
                hidden_size_per_layer_input=8, vocab_size_per_layer_input=128, num_kv_shared_layers=2,
                attention_k_eq_v=True, use_double_wide_mlp=True, final_logit_softcapping=30.0,
                max_position_embeddings=256)
    base.update(kw)
    return base


def _hf_model(config: dict, seed: int = 0):
    """A transformers Gemma 4 model of `config` whose weights and layer scalars (buffers, which transformers'
    init leaves at 1) are all moved off their init."""
    hf_cfg = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(seed)
    ref = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for name, b in ref.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand_like(b))
    return ref


def _logits(ref, ids):
    with torch.no_grad():
        return ref(torch.tensor(ids, dtype=torch.long)).logits.numpy()


def test_the_text_config_reads_as_the_tiny_preset_and_writes_back():
    cfg = ModelConfig.from_hf_config(_text_config())
    assert cfg == tiny_config("gemma4")
    assert [cfg.kv_reused(i) for i in range(6)] == [False] * 4 + [True] * 2
    assert [cfg.values_from_keys(i) for i in range(6)] == [False, False, True] * 2
    assert ModelConfig.from_hf_config(cfg.to_hf_config()) == cfg


def test_per_layer_config_as_transformers_saves_it_reads_the_same():
    """transformers saves the full layers' shape per layer, its indices zero-padded, and no global_head_dim."""
    saved = _text_config(per_layer_config={"02": {"head_dim": 32, "num_key_value_heads": 1},
                                           "05": {"head_dim": 32, "num_key_value_heads": 1}})
    del saved["global_head_dim"], saved["num_global_key_value_heads"]
    assert ModelConfig.from_hf_config(saved) == tiny_config("gemma4")


def test_the_multimodal_config_gives_its_text_model():
    text = _text_config()
    text.pop("model_type")
    cfg = ModelConfig.from_hf_config({"model_type": "gemma4", "text_config": text,
                                      "vision_config": {"hidden_size": 32}, "audio_config": None})
    assert cfg == tiny_config("gemma4")


def test_transformers_defaults_fill_missing_keys():
    """Without layer_types, five sliding layers to one full; the last layer full whatever the list says; the
    default ropes (10k on sliding layers, a proportional 1M rotating a quarter of the pairs on full ones)."""
    cfg = ModelConfig.from_hf_config(_text_config(num_hidden_layers=7, layer_types=None, num_kv_shared_layers=0,
                                                  attention_k_eq_v=False))
    assert cfg.layer_types == ("sliding",) * 5 + ("full", "full")
    assert (cfg.global_head_dim, cfg.global_kv_heads) == (32, 0)  # the global KV heads only with attention_k_eq_v
    cfg = ModelConfig.from_hf_config({k: v for k, v in _text_config().items() if k != "global_head_dim"})
    assert cfg.global_head_dim == 512  # transformers' default
    assert cfg.rope == RopeConfig(theta=1e6, scaling="proportional", rotated_fraction=0.25)
    assert cfg.rope_local == RopeConfig(theta=1e4)
    cfg = ModelConfig.from_hf_config(_text_config(layer_types=["sliding_attention"] * 6, num_kv_shared_layers=0))
    assert cfg.layer_types[-1] == "full"


def test_proportional_rope_rotates_the_first_pairs_over_the_whole_head():
    """transformers' proportional rope: theta^(-2i/head_dim) for the first fraction of the pairs, 0 for the rest (so
    rotate-half still pairs feature i with i + head_dim/2)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg = transformers.AutoConfig.for_model(**_text_config(head_dim=32, global_head_dim=32))
    want, _ = ROPE_INIT_FUNCTIONS["proportional"](hf_cfg, None, layer_type="full_attention")
    got = rope_inverse_frequencies(RopeConfig(theta=1e6, scaling="proportional", rotated_fraction=0.25), 32)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-6)
    assert int(np.count_nonzero(np.asarray(got))) == 4


@pytest.mark.parametrize("changes", [
    {},
    {"attention_bias": True, "num_kv_shared_layers": 3, "attention_k_eq_v": False},  # shared k/v biases left out
    {"hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "hidden_activation": "silu"},
    # one attention shape: the stacks split by MLP width only, each holding sliding and full layers
    {"global_head_dim": 16, "num_global_key_value_heads": None},
    {"global_head_dim": 16, "num_global_key_value_heads": None, "use_double_wide_mlp": False},  # one stack
    {"use_double_wide_mlp": False},
    {"layer_types": ["full_attention"] * 6, "num_kv_shared_layers": 1},  # every layer full: the full shape throughout
], ids=["preset", "bias-3-shared", "no-per-layer-inputs", "one-shape", "one-stack", "one-mlp-width", "all-full"])
def test_logits_match_transformers_with_layer_scalars_and_shared_layers(tmp_path, changes):
    """transformers' files hold no key/value projections for the KV-shared layers and no value projection for the
    full layers with attention_k_eq_v: tempax loads them, matches its logits, and writes back the same tensors."""
    ref = _hf_model(_text_config(**changes))
    ref.save_pretrained(tmp_path / "hf")
    model = load_hf_checkpoint(str(tmp_path / "hf"), progress=False)
    ids = random_ids((2, 13))
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(ids))[0]), _logits(ref, ids), atol=TOL, rtol=0)
    ours = dict(iter_hf_tensors(model))
    theirs = {k: v.numpy() for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


@pytest.mark.heavy
def test_shared_layers_ignore_their_own_key_projections_and_per_layer_inputs_matter():
    cfg = tiny_config("gemma4")
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    ids = jnp.asarray(random_ids((1, 9)))
    before = np.asarray(model(ids)[0])
    assert model.config.layer_stacks() == {"layers": (0, 1, 3), "full_layers": (2,), "shared_layers": (4,),
                                           "shared_full_layers": (5,)}
    assert model.shared_layers.mlp.up_proj.kernel.shape == (1, 64, 2 * 96)  # the KV-shared layers' wider MLP
    for stack in (model.shared_layers, model.shared_full_layers):  # layers 4 and 5: their keys are never read
        kernel = stack.self_attn.k_proj.kernel
        kernel.set_value(kernel[...] + 1.0)
    np.testing.assert_array_equal(np.asarray(model(ids)[0]), before)
    sliding = model.layers.self_attn.k_proj.kernel
    sliding.set_value(sliding[...].at[2].set(1.0))  # layer 3's, whose keys layer 4 reuses
    assert np.abs(np.asarray(model(ids)[0]) - before).max() > 1e-3
    table = model.per_layer_inputs.embed_tokens_per_layer.embedding
    table.set_value(table[...] * 0)
    assert np.abs(np.asarray(model(ids)[0]) - before).max() > 1e-3


@pytest.mark.heavy
def test_no_gradient_reaches_the_layer_scalars():
    """transformers keeps layer_scalar as a buffer: tempax holds it as a weight but trains it not."""
    model = Decoder(tiny_config("gemma4"), rngs=nnx.Rngs(0))
    ids = jnp.asarray(random_ids((1, 7)))
    grads = nnx.grad(lambda m: jnp.sum(m(ids)[0] ** 2))(model)
    assert not np.any(np.asarray(grads.layers.layer_scalar[...]))
    for stack in ("full_layers", "shared_layers", "shared_full_layers"):
        assert not np.any(np.asarray(getattr(grads, stack).layer_scalar[...]))
    assert np.any(np.asarray(grads.layers.post_per_layer_input_norm.weight[...]))


def test_a_multimodal_checkpoint_loads_its_language_model_and_skips_the_towers(tmp_path):
    ref = _hf_model(_text_config())
    ref.save_pretrained(tmp_path / "text")
    as_multimodal_checkpoint(tmp_path / "text", tmp_path / "mm", "gemma4", "Gemma4ForConditionalGeneration",
                             {"model.vision_tower.encoder.layers.0.mlp.gate_proj.linear.weight":
                                  np.zeros((3, 3), np.float32),
                              "model.embed_vision.embedding_projection.weight": np.zeros((4, 4), np.float32)})
    loaded = load_hf_checkpoint(str(tmp_path / "mm"), progress=False)
    ids = random_ids((1, 9))
    np.testing.assert_allclose(np.asarray(loaded(jnp.asarray(ids))[0]), _logits(ref, ids), atol=TOL, rtol=0)


@pytest.mark.parametrize("changes, named", [
    ({"per_layer_config": {"0": {"head_dim": 32}}}, "per-layer settings .*sliding layers"),
    ({"per_layer_config": {"2": {"head_dim": 32}, "5": {"head_dim": 64}}}, "per-layer settings .*full layers"),
    ({"per_layer_config": {"2": {"intermediate_size": 32}}}, "per-layer settings .*intermediate_size"),
    ({"enable_moe_block": True, "top_k_experts": 2, "moe_intermediate_size": 16},
     "enable_moe_block=true without num_experts"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention='all'"),
    ({"hidden_activation": "relu"}, "hidden_activation='relu'"),
])
def test_switches_tempax_cannot_run_exactly_are_refused_by_name(changes, named):
    """Per-layer shapes other than one for the sliding layers and one for the full layers and bidirectional
    attention have no place in tempax's layer stacks; the sparse block beside the MLP (tests/models/test_gemma4_moe.py)
    needs its expert count."""
    with pytest.raises(CheckpointError, match=named):
        ModelConfig.from_hf_config(_text_config(**changes))


def test_a_gemma4_model_is_refused_where_its_switches_have_no_place(tmp_path):
    from tempax.models.gguf_export import save_gguf
    from tempax.models.surgery import keep_layers

    cfg = tiny_config("gemma4")
    with pytest.raises(CheckpointError, match="a llama config.json cannot express v_norm=True.*family gemma4"):
        cfg.replace(family="llama").to_hf_config()
    with pytest.raises(CheckpointError, match="a gemma4 config.json cannot express norm_offset=True"):
        cfg.replace(norm_offset=True).to_hf_config()
    with pytest.raises(ConfigError, match="kv_shared_layers=2: layers of kind \\['full'\\]"):
        cfg.replace(layer_types=("sliding",) * 4 + ("full",) * 2)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="cannot export this gemma4 model to GGUF: Gemma 4's switches"):
        save_gguf(model, tmp_path / "g.gguf")
    with pytest.raises(ConfigError, match="keep_layers cannot cut this gemma4 model"):
        keep_layers(model, [0, 1, 2])


@pytest.mark.heavy
def test_init_decoder_equals_the_constructor():
    """The three-program initialiser draws the per-layer inputs after the head, as the one-program jitted
    constructor does: every weight equal bit for bit."""
    from tempax.models.init import init_decoder

    cfg = tiny_config("gemma4")
    a = jax.jit(lambda: nnx.state(Decoder(cfg, rngs=nnx.Rngs(3))))()
    b = nnx.state(init_decoder(cfg, 3))
    for (path, x), (_, y) in zip(nnx.to_flat_state(a), nnx.to_flat_state(b)):
        np.testing.assert_array_equal(np.asarray(x.get_value()), np.asarray(y.get_value()), err_msg=str(path))
    assert jax.tree.structure(a) == jax.tree.structure(b)


def test_save_hf_checkpoint_leaves_out_the_unread_weights(tmp_path):
    model = Decoder(tiny_config("gemma4"), rngs=nnx.Rngs(0))
    save_hf_checkpoint(model, str(tmp_path))
    names = set(dict(iter_hf_tensors(model)))
    assert "model.layers.3.self_attn.k_proj.weight" in names
    assert dict(iter_hf_tensors(model))["model.layers.2.self_attn.q_proj.weight"].shape == (4 * 32, 64)
    assert not any(f"model.layers.{i}.self_attn.{p}" in n for i in (4, 5) for p in ("k_proj", "v_proj", "k_norm")
                   for n in names)
    assert "model.layers.2.self_attn.v_proj.weight" not in names  # a full layer: values are keys
    assert "model.embed_tokens_per_layer.weight" in names and "model.layers.0.layer_scalar" in names
