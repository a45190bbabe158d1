"""`tempax export` of a LoRA run on a mixture of experts whose adapters sit on the attention, the routed experts
and the router: a tiny-qwen3-moe SFT run through the real CLI, exported merged (transformers and tempax load it
with the run's logits) and as adapters alone in PEFT's target_parameters layout."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax.cli.main import main
from tests.cli.test_train_cmds import workspace  # noqa: F401  (the fixture: a tiny tokenizer and chat data)


@pytest.fixture(scope="module")
def trained(workspace, tmp_path_factory):  # noqa: F811
    """The CLI tests' tiny LoRA SFT recipe on tiny-qwen3-moe (one layer), adapting q_proj, the experts and the
    router."""
    _, recipe, _ = workspace
    run_dir = tmp_path_factory.mktemp("moe-lora") / "run"
    assert main(["sft", "--config", str(recipe), "model.source=preset:tiny-qwen3-moe",
                 "lora.target_modules=[q_proj, experts, router]", f"train.run_dir={run_dir}"]) == 0
    return run_dir


@pytest.mark.heavy
def test_export_merges_expert_and_router_adapters(trained, tmp_path):
    """The run trained the experts' and the router's adapters (B moved off zero); the merged export gives the run's
    LoRA logits in tempax (atol 1e-4), and the adapters-only export names them in PEFT's layout: target_modules
    q_proj, target_parameters the experts' two parameters and the router's weight."""
    from tempax.algorithms.run_dirs import load_run
    from tempax.models.hf_io import load_hf_checkpoint
    from tempax.models.lora import lora_experts, lora_layers

    run = load_run(str(trained), merge=False)
    (_, experts), = lora_experts(run.model)
    assert experts.adapted_params() == ["gate_up_proj", "down_proj"]
    assert float(jnp.max(jnp.abs(experts.down_b[...]))) > 0
    assert {p[-1] for p, _ in lora_layers(run.model)} == {"q_proj", "gate"}
    out = tmp_path / "hf"
    assert main(["export", str(trained), str(out)]) == 0
    tokens = jnp.asarray(np.arange(12, dtype=np.int32).reshape(2, 6) + 5)
    expected = np.asarray(run.model(tokens)[0])
    assert_allclose(np.asarray(load_hf_checkpoint(str(out))(tokens)[0]), expected, atol=1e-4, rtol=0)
    assert main(["export", str(trained), str(tmp_path / "adapters"), "--adapters"]) == 0
    with open(os.path.join(tmp_path / "adapters", "adapter_config.json")) as f:
        config = json.load(f)
    assert config["target_modules"] == ["q_proj"]
    assert sorted(config["target_parameters"]) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj",
                                                   "mlp.gate.weight"]


@pytest.mark.heavy
def test_transformers_loads_the_merged_export(trained, tmp_path):
    """transformers' AutoModelForCausalLM of the merged export gives the run's LoRA logits within 1e-4."""
    torch = pytest.importorskip("torch")
    import transformers

    from tempax.algorithms.run_dirs import load_run

    out = tmp_path / "hf"
    assert main(["export", str(trained), str(out)]) == 0
    tokens = np.arange(12, dtype=np.int64).reshape(2, 6) + 5
    expected = np.asarray(load_run(str(trained), merge=False).model(jnp.asarray(tokens, jnp.int32))[0])
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    with torch.no_grad():
        got = ref(torch.tensor(tokens)).logits.numpy()
    assert_allclose(got, expected, atol=1e-4, rtol=0)
