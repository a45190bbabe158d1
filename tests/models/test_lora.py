"""LoRA adapters: zero-B and adapters-off invariance, adapter-only training, KV cache, PEFT save/load, merge export;
a mixture of experts' expert and router adapters through PEFT's target_parameters, both directions."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tempax.errors import CheckpointError, ConfigError
from tempax.models.cache import KVCache
from tempax.models.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    LoraConfig,
    LoraLinear,
    apply_lora,
    disable_adapters,
    load_adapters,
    lora_experts,
    lora_filter,
    lora_layers,
    merge_lora,
    peft_unsupported_reason,
    save_adapters,
    target_paths,
)
from tests.kit.models import TINY_MOE_FAMILIES, family_cases, random_ids, tiny_tempax_model

CFG = LoraConfig(rank=4, alpha=8.0)


@nnx.jit
def _logits(model, tokens):
    return model(tokens)[0]


def _randomize_b(model, seed: int = 0, scale: float = 0.2):
    """Non-zero B everywhere, so adapters change the output."""
    for i, (_, layer) in enumerate(lora_layers(model)):
        key = jax.random.fold_in(jax.random.key(seed), i)
        layer.lora_b.set_value(jax.random.normal(key, layer.lora_b.shape) * scale)
    return model


def _arrays(model, filt):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, filt))]


@pytest.fixture(scope="module", params=["llama", "qwen2"])  # qwen2: q/k/v biases stay in the base layer
def base(request):
    return tiny_tempax_model(request.param)


@pytest.fixture(scope="module")
def tokens():
    return jnp.asarray(random_ids((2, 9), seed=1))


# --------------------------------------------------------------------------------------------------------------
def test_config_validation():
    with pytest.raises(ConfigError, match="rank must be positive"):
        LoraConfig(rank=0)
    with pytest.raises(ConfigError, match="quantize_base"):
        LoraConfig(quantize_base="nf8")
    with pytest.raises(ConfigError, match="not a valid regex"):
        LoraConfig(target_modules=("q_proj(",))
    with pytest.raises(ConfigError, match="dropout"):
        LoraConfig(dropout=1.0)


@pytest.mark.heavy
def test_adapter_dropout_under_remat_draws_new_masks_each_call_and_matches_no_remat():
    """The decoder's scan carries the adapters' dropout stream through every layer, remat or not: two calls in
    train mode draw different masks (different outputs), and remat=full computes the same loss and gradients as
    remat=none from the same stream (the backward's recomputation replays the forward's masks)."""
    tokens = jnp.asarray(random_ids((2, 6), seed=3))

    def adapted(remat):
        model = apply_lora(tiny_tempax_model("llama", remat=remat), LoraConfig(rank=4, dropout=0.5),
                           rngs=nnx.Rngs(0))
        for _, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
            var.set_value(var.get_value() + 0.1)  # B = 0 would hide the adapters' (and dropout's) effect
        model.train()
        return model

    def loss(model):
        return jnp.mean(model(tokens)[0] ** 2)

    model = adapted("full")
    first, second = float(loss(model)), float(loss(model))
    assert first != second
    results = []
    for remat in ("none", "full"):
        graphdef, lora, rest = nnx.split(adapted(remat), nnx.LoRAParam, ...)
        value, grads = jax.value_and_grad(lambda p: loss(nnx.merge(graphdef, p, rest, copy=True)))(lora)
        results.append((float(value), jax.tree.leaves(grads)))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_target_patterns_select_by_name_path_and_hf_name():
    """tiny-llama has 3 layers x 7 projections. "q_proj" picks 3; the path regex picks layer 1's 3 MLP
    projections; the HF-name regex picks layer 2's o_proj: 3 + 3 + 1 = 7 layers."""
    model = nnx.eval_shape(lambda: tiny_tempax_model("llama"))  # structure only
    cfg = LoraConfig(target_modules=("q_proj", r"layers\.1\.mlp\..*", r"model\.layers\.2\.self_attn\.o_proj"))
    got = {".".join(map(str, p)) for p in target_paths(model, cfg)}
    assert got == {
        "layers.0.self_attn.q_proj", "layers.1.self_attn.q_proj", "layers.2.self_attn.q_proj",
        "layers.1.mlp.gate_proj", "layers.1.mlp.up_proj", "layers.1.mlp.down_proj", "layers.2.self_attn.o_proj",
    }
    with pytest.raises(ConfigError, match="'qkv_proj' matches no linear layer.*down_proj, gate_proj"):
        target_paths(model, LoraConfig(target_modules=("qkv_proj",)))


def test_apply_leaves_input_model_unchanged(base):
    lora = apply_lora(base, CFG, rngs=nnx.Rngs(1))
    assert not any(isinstance(m, LoraLinear) for _, m in nnx.iter_modules(base))
    assert len(list(lora_layers(lora))) == 7  # one per projection, its adapters stacked over the layers
    q = lora.layers.self_attn.q_proj
    layers = base.config.num_layers
    assert q.lora_a.shape == (layers, 64, 4) and q.lora_b.shape == (layers, 4, 64)
    assert q.lora_a.get_metadata()["out_sharding"] == ("layers", "embed", "lora_rank")
    assert q.layer_mask is None  # every layer adapted
    assert not np.any(np.asarray(q.lora_b[...]))
    # PEFT's default init bound for A is 1 / sqrt(fan_in) = 1 / sqrt(64) = 0.125.
    assert 0 < np.abs(np.asarray(q.lora_a[...])).max() <= 0.125


def test_zero_b_equals_base(base, tokens):
    """B = 0: the adapters add exact zeros. Not bit for bit: the adapted layer is another program, and XLA:CPU
    may fold a projection's bias into its product in one and not the other (seen: 2.4e-7 on qwen2's qkv
    biases, float32 rounding of logits near 0.5)."""
    lora = apply_lora(base, CFG, rngs=nnx.Rngs(1))
    np.testing.assert_allclose(np.asarray(_logits(lora, tokens)), np.asarray(_logits(base, tokens)), atol=1e-6,
                               rtol=0)


def test_disable_adapters_gives_base_logits_exactly(base, tokens):
    lora = _randomize_b(apply_lora(base, CFG, rngs=nnx.Rngs(1)))
    expected = np.asarray(_logits(base, tokens))
    adapted = np.asarray(_logits(lora, tokens))
    assert np.abs(adapted - expected).max() > 1e-2
    with disable_adapters(lora):
        np.testing.assert_array_equal(np.asarray(_logits(lora, tokens)), expected)
    assert all(layer.adapters_enabled for _, layer in lora_layers(lora))

    @nnx.jit
    def policy_and_reference(model, tokens):  # how DPO / GRPO use it: both in one compiled step
        with disable_adapters(model):
            ref = model(tokens)[0]
        return model(tokens)[0], ref

    policy, ref = policy_and_reference(lora, tokens)
    np.testing.assert_array_equal(np.asarray(ref), expected)
    np.testing.assert_array_equal(np.asarray(policy), adapted)
    with pytest.raises(ConfigError, match="no LoRA adapters"):
        with disable_adapters(base):
            pass


def test_gradient_step_changes_adapters_only(tokens):
    """One adamw step with wrt=lora_filter: every B moves (its gradient is non-zero), the base is bit-identical,
    and the optimizer holds state for the adapters only (2 moments x 2 matrices x 7 projections, each stacked
    over the 3 layers)."""
    model = apply_lora(tiny_tempax_model("qwen2"), CFG, rngs=nnx.Rngs(1))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=lora_filter)
    base_before = _arrays(model, nnx.Not(lora_filter))
    b_before = [np.asarray(layer.lora_b[...]) for _, layer in lora_layers(model)]

    @nnx.jit
    def step(model, optimizer, tokens):
        def loss_fn(model):
            logits = model(tokens)[0]
            return -jnp.mean(jax.nn.log_softmax(logits)[:, :-1].max(-1))

        loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, lora_filter))(model)
        optimizer.update(model, grads)
        return loss, grads

    _, grads = step(model, optimizer, tokens)
    grad_paths = [path for path, _ in nnx.to_flat_state(grads)]
    assert len(grad_paths) == 2 * 7 and {p[-1] for p in grad_paths} == {"lora_a", "lora_b"}
    for before, after in zip(base_before, _arrays(model, nnx.Not(lora_filter))):
        np.testing.assert_array_equal(before, after)
    for before, (_, layer) in zip(b_before, lora_layers(model)):
        after = np.asarray(layer.lora_b[...])
        assert all(not np.array_equal(before[i], after[i]) for i in range(3))  # each layer's B moved
    moments = [x for x in jax.tree.leaves(nnx.state(optimizer)) if np.ndim(x) == 3]
    assert len(moments) == 2 * 2 * 7


def test_kv_cache_decoding_with_adapters(tokens):
    """Prefill 4 tokens, then 5 single-token steps through the cache: the same logits as one full forward."""
    model = _randomize_b(apply_lora(tiny_tempax_model("llama"), CFG, rngs=nnx.Rngs(1)))
    full = np.asarray(_logits(model, tokens))

    @nnx.jit
    def cached(model, tokens, cache):
        return model(tokens, cache=cache)

    cache = KVCache.init(model.config, batch_size=2, max_len=12)
    logits, cache = cached(model, tokens[:, :4], cache)
    steps = [np.asarray(logits)]
    for t in range(4, 9):
        logits, cache = cached(model, tokens[:, t:t + 1], cache)
        steps.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5, rtol=0)


def test_dropout_follows_train_and_eval(tokens):
    """rate 0.5 in train mode: two calls differ (fresh masks) and differ from the no-dropout output;
    model.eval() turns it off: identical to a dropout-free model with the same adapters."""
    base = tiny_tempax_model("llama")
    model = _randomize_b(apply_lora(base, LoraConfig(rank=4, alpha=8.0, dropout=0.5), rngs=nnx.Rngs(1)))
    clean = apply_lora(base, CFG, rngs=nnx.Rngs(1))
    nnx.update(clean, nnx.state(model, lora_filter))
    first, second = np.asarray(_logits(model, tokens)), np.asarray(_logits(model, tokens))
    expected = np.asarray(_logits(clean, tokens))
    assert np.abs(first - second).max() > 1e-3 and np.abs(first - expected).max() > 1e-3
    model.eval()
    np.testing.assert_array_equal(np.asarray(_logits(model, tokens)), expected)
    model.train()
    assert np.abs(np.asarray(_logits(model, tokens)) - expected).max() > 1e-3


def test_remat_gives_the_same_gradients(tokens):
    """Activation recomputation (remat="full") must not change adapter gradients (2 layers keep it quick)."""
    def grads_of(remat):
        base = tiny_tempax_model("llama", num_layers=2, remat=remat)
        model = _randomize_b(apply_lora(base, CFG, rngs=nnx.Rngs(1)))

        @nnx.jit
        def g(model, tokens):
            return nnx.grad(lambda m: jnp.mean(m(tokens)[0] ** 2), argnums=nnx.DiffState(0, lora_filter))(model)

        return [np.asarray(x) for x in jax.tree.leaves(g(model, tokens))]

    for a, b in zip(grads_of("none"), grads_of("full")):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------------------------------------------
def test_save_load_round_trip_peft_layout(base, tokens, tmp_path):
    lora = _randomize_b(apply_lora(base, CFG, rngs=nnx.Rngs(1)))
    save_adapters(lora, str(tmp_path), base_model_name_or_path="tiny")
    from safetensors.numpy import load_file

    tensors = load_file(os.path.join(tmp_path, ADAPTER_WEIGHTS))
    assert len(tensors) == 2 * 7 * base.config.num_layers
    a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.2.mlp.down_proj.lora_B.weight"]
    assert a.shape == (4, 64) and b.shape == (64, 4)  # PEFT: A [r, in], B [out, r]
    np.testing.assert_array_equal(a, np.asarray(lora.layers.self_attn.q_proj.lora_a[...])[0].T)
    with open(os.path.join(tmp_path, ADAPTER_CONFIG)) as f:
        config = json.load(f)
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["peft_type"] == "LORA"
    assert config["base_model_name_or_path"] == "tiny"
    assert config["target_modules"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]

    loaded = load_adapters(base, str(tmp_path))
    np.testing.assert_array_equal(np.asarray(_logits(loaded, tokens)), np.asarray(_logits(lora, tokens)))
    # Loading into a model that already has adapters fills them in place.
    fresh = apply_lora(base, CFG, rngs=nnx.Rngs(7))
    assert load_adapters(fresh, str(tmp_path)) is fresh
    np.testing.assert_array_equal(np.asarray(_logits(fresh, tokens)), np.asarray(_logits(lora, tokens)))


def test_partial_targets_save_as_exact_regex(tmp_path, tokens):
    base = tiny_tempax_model("llama")
    cfg = LoraConfig(rank=2, alpha=2.0, target_modules=(r"layers\.[01]\.self_attn\.v_proj",))
    lora = _randomize_b(apply_lora(base, cfg, rngs=nnx.Rngs(1)))
    save_adapters(lora, str(tmp_path))
    with open(os.path.join(tmp_path, ADAPTER_CONFIG)) as f:
        targets = json.load(f)["target_modules"]
    assert targets == r"model\.layers\.0\.self_attn\.v_proj|model\.layers\.1\.self_attn\.v_proj"
    loaded = load_adapters(base, str(tmp_path))
    assert [p for p, _ in lora_layers(loaded)] == [p for p, _ in lora_layers(lora)]
    np.testing.assert_array_equal(np.asarray(_logits(loaded, tokens)), np.asarray(_logits(lora, tokens)))


def test_load_errors_name_the_problem(tmp_path):
    base = tiny_tempax_model("llama")
    with pytest.raises(CheckpointError, match="adapter_config.json not found"):
        load_adapters(base, str(tmp_path))
    save_adapters(apply_lora(base, CFG, rngs=nnx.Rngs(1)), str(tmp_path))
    with pytest.raises(CheckpointError, match="rank or base model differ"):
        load_adapters(apply_lora(base, LoraConfig(rank=8), rngs=nnx.Rngs(1)), str(tmp_path))
    with pytest.raises(CheckpointError, match="no adapter in this model"):
        load_adapters(apply_lora(base, LoraConfig(rank=4, target_modules=("q_proj",)), rngs=nnx.Rngs(1)), str(tmp_path))


def test_merge_gives_a_plain_decoder_with_the_same_logits(base, tokens):
    lora = _randomize_b(apply_lora(base, CFG, rngs=nnx.Rngs(1)))
    merged = merge_lora(lora)
    assert type(merged) is type(base)
    assert not nnx.state(merged, lora_filter)
    assert isinstance(merged.layers.self_attn.q_proj, nnx.Linear)
    expected = np.asarray(_logits(lora, tokens))
    np.testing.assert_allclose(np.asarray(_logits(merged, tokens)), expected, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------------------------
def _torch_logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.numpy()


def test_merged_export_loads_in_transformers(base, tokens, tmp_path):
    """merge_lora -> save_hf_checkpoint -> transformers gives the tempax LoRA model's logits (atol 1e-4)."""
    pytest.importorskip("torch")
    import transformers

    from tempax.models.hf_io import save_hf_checkpoint

    lora = _randomize_b(apply_lora(base, CFG, rngs=nnx.Rngs(1)))
    save_hf_checkpoint(merge_lora(lora), str(tmp_path))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    np.testing.assert_allclose(_torch_logits(ref, tokens), np.asarray(_logits(lora, tokens)), atol=1e-4, rtol=0)


def test_peft_adapter_file_means_the_same_update_in_torch(tokens, tmp_path):
    """Applying the saved file by PEFT's rule, W_hf += (lora_alpha / r) * lora_B @ lora_A on the exported base,
    reproduces the tempax LoRA logits: names, shapes, transposes and scaling mean what PEFT means."""
    torch = pytest.importorskip("torch")
    import transformers
    from safetensors.torch import load_file

    from tempax.models.hf_io import save_hf_checkpoint

    base = tiny_tempax_model("qwen2")
    lora = _randomize_b(apply_lora(base, CFG, rngs=nnx.Rngs(1)))
    save_hf_checkpoint(base, str(tmp_path / "base"))
    save_adapters(lora, str(tmp_path / "adapter"))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")).eval()
    tensors = load_file(str(tmp_path / "adapter" / ADAPTER_WEIGHTS))
    params = dict(ref.named_parameters())
    with torch.no_grad():
        for name, a in tensors.items():
            if ".lora_A." not in name:
                continue
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            target = name.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
            params[target].add_((8.0 / 4) * (b @ a))
    np.testing.assert_allclose(_torch_logits(ref, tokens), np.asarray(_logits(lora, tokens)), atol=1e-4, rtol=0)


def test_peft_loads_saved_adapters(tokens, tmp_path):
    """PeftModel.from_pretrained(base, folder) matches the tempax LoRA logits, for all
    projections and for a regex subset."""
    pytest.importorskip("torch")
    import peft  # in the test extra, so this runs wherever the suite runs
    import transformers

    from tempax.models.hf_io import save_hf_checkpoint

    base = tiny_tempax_model("llama")
    save_hf_checkpoint(base, str(tmp_path / "base"))
    for i, cfg in enumerate([CFG, LoraConfig(rank=2, alpha=6.0, target_modules=(r"layers\.[12]\..*_proj",))]):
        lora = _randomize_b(apply_lora(base, cfg, rngs=nnx.Rngs(1)))
        save_adapters(lora, str(tmp_path / f"adapter{i}"), base_model_name_or_path=str(tmp_path / "base"))
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")).eval()
        ref = peft.PeftModel.from_pretrained(ref, str(tmp_path / f"adapter{i}")).eval()
        np.testing.assert_allclose(_torch_logits(ref, tokens), np.asarray(_logits(lora, tokens)), atol=1e-4, rtol=0)


def _peft_trained(base, config, tmp_path):
    """(base, peft model): `base` saved to tmp_path/base, peft's adapters of `config` on it with random B saved to
    tmp_path/adapter."""
    import torch
    import peft
    import transformers

    from tempax.models.hf_io import save_hf_checkpoint

    save_hf_checkpoint(base, str(tmp_path / "base"))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")).eval()
    ref = peft.get_peft_model(ref, config).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    ref.save_pretrained(str(tmp_path / "adapter"))
    return base, ref


def test_adapters_trained_with_peft_load_into_tempax(tokens, tmp_path):
    """Adapters made by peft (random B) load with load_adapters and give peft's logits."""
    pytest.importorskip("torch")
    import peft  # in the test extra, so this runs wherever the suite runs

    config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])
    base, ref = _peft_trained(tiny_tempax_model("qwen2"), config, tmp_path)
    loaded = load_adapters(base, str(tmp_path / "adapter"))
    assert len(list(lora_layers(loaded))) == 3  # q, k and v, each stacked over the layers
    np.testing.assert_allclose(np.asarray(_logits(loaded, tokens)), _torch_logits(ref, tokens), atol=1e-4, rtol=0)


def test_adapters_of_a_fused_family_are_refused_in_peft_layout(tmp_path):
    """Phi-3's checkpoints fuse qkv_proj and gate_up_proj: PEFT would load separate q/k/v adapters and silently
    drop them, so the PEFT file is refused with the way out (export the merged model)."""
    lora = apply_lora(tiny_tempax_model("phi3"), CFG, rngs=nnx.Rngs(1))
    assert peft_unsupported_reason(lora) is not None
    with pytest.raises(ConfigError, match="fuse mlp.gate_up_proj, self_attn.qkv_proj.*tempax export"):
        save_adapters(lora, str(tmp_path))
    assert not os.listdir(tmp_path)
    assert peft_unsupported_reason(apply_lora(tiny_tempax_model("llama"), CFG, rngs=nnx.Rngs(1))) is None


# --------------------------------------------------------------------------------------------------------------
# A mixture of experts: adapters on the routed experts and the router (PEFT's target_parameters)


def _randomize_expert_b(model, seed: int = 0, scale: float = 0.2):
    """Non-zero B on every adapter, the experts' included."""
    _randomize_b(model, seed, scale)
    for j, (_, experts) in enumerate(lora_experts(model)):
        for k, name in enumerate(experts.adapted_params()):
            b = experts.factors(name)[1]
            b.set_value(jax.random.normal(jax.random.fold_in(jax.random.key(seed + 100), 10 * j + k), b.shape) * scale)
    return model


MOE_TARGETS = (("q_proj", "experts", "router"),
               (r"layers\.[01]\.mlp\.experts\.gate_up_proj", r"layers\.2\.mlp\.experts\.down_proj", "k_proj"))


@pytest.mark.parametrize("family", family_cases(TINY_MOE_FAMILIES))
def test_peft_loads_saved_expert_and_router_adapters(family, tokens, tmp_path):
    """LoRA on the attention, the routed experts and the router of each tiny mixture of experts (gpt-oss: its
    router is mlp.router, its gate_up_proj interleaved), and on some layers' experts only: PeftModel.from_pretrained
    of the saved folder gives the tempax logits within 1e-4 (float32), the adapters moving them by far more; the
    folder loads back into tempax with the same logits."""
    pytest.importorskip("torch")
    import peft  # in the test extra, so this runs wherever the suite runs
    import transformers

    from tempax.models.hf_io import save_hf_checkpoint

    base = tiny_tempax_model(family)
    save_hf_checkpoint(base, str(tmp_path / "base"))
    plain = _torch_logits(transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")).eval(), tokens)
    for i, targets in enumerate(MOE_TARGETS):
        lora = _randomize_expert_b(apply_lora(base, LoraConfig(rank=2, alpha=6.0, target_modules=targets),
                                              rngs=nnx.Rngs(1)))
        folder = str(tmp_path / f"adapter{i}")
        save_adapters(lora, folder, base_model_name_or_path=str(tmp_path / "base"))
        with open(os.path.join(folder, ADAPTER_CONFIG)) as f:
            config = json.load(f)
        router = "mlp.router.weight" if family == "gpt_oss" else "mlp.gate.weight"
        if i == 0:
            assert config["target_modules"] == ["q_proj"]
            assert sorted(config["target_parameters"]) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj", router]
        else:
            assert config["target_parameters"] == ["model.layers.0.mlp.experts.gate_up_proj",
                                                   "model.layers.1.mlp.experts.gate_up_proj",
                                                   "model.layers.2.mlp.experts.down_proj"]
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")).eval()
        ref = peft.PeftModel.from_pretrained(ref, folder).eval()
        expected = np.asarray(_logits(lora, tokens))
        got = _torch_logits(ref, tokens)
        assert np.max(np.abs(got - plain)) > 0.05
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
        loaded = load_adapters(base, folder)
        np.testing.assert_array_equal(np.asarray(_logits(loaded, tokens)), expected)


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_expert_adapters_trained_with_peft_load_into_tempax(family, tokens, tmp_path):
    """Adapters peft makes with target_parameters on the experts' gate_up_proj and down_proj and on the router, and
    target_modules on v_proj (random B), load with load_adapters and give peft's logits within 1e-4."""
    pytest.importorskip("torch")
    import peft  # in the test extra, so this runs wherever the suite runs

    router = "mlp.router.weight" if family == "gpt_oss" else "mlp.gate.weight"
    config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["v_proj"],
                             target_parameters=["gate_up_proj", "down_proj", router])
    base, ref = _peft_trained(tiny_tempax_model(family), config, tmp_path)
    loaded = load_adapters(base, str(tmp_path / "adapter"))
    assert {p[-1] for p, _ in lora_layers(loaded)} == {"v_proj", "gate"}
    (_, experts), = lora_experts(loaded)
    assert experts.adapted_params() == ["gate_up_proj", "down_proj"]
    np.testing.assert_allclose(np.asarray(_logits(loaded, tokens)), _torch_logits(ref, tokens), atol=1e-4, rtol=0)
    with pytest.raises(CheckpointError, match="target_parameters .*has none"):
        load_adapters(tiny_tempax_model("llama"), str(tmp_path / "adapter"))


@pytest.mark.parametrize("family", TINY_MOE_FAMILIES)
def test_merged_expert_lora_export_loads_in_transformers(family, tokens, tmp_path):
    """merge_lora of LoRA on attention, experts and router -> save_hf_checkpoint (what `tempax export` writes) ->
    transformers gives the tempax LoRA model's logits (atol 1e-4)."""
    pytest.importorskip("torch")
    import transformers

    from tempax.models.hf_io import save_hf_checkpoint

    cfg = LoraConfig(rank=2, alpha=6.0, target_modules=MOE_TARGETS[0])
    lora = _randomize_expert_b(apply_lora(tiny_tempax_model(family), cfg, rngs=nnx.Rngs(1)))
    save_hf_checkpoint(merge_lora(lora), str(tmp_path))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    np.testing.assert_allclose(_torch_logits(ref, tokens), np.asarray(_logits(lora, tokens)), atol=1e-4, rtol=0)
