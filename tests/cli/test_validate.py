"""`tempax validate RECIPE`: a valid recipe exits 0 and says so, a refused one exits 2 with the check's message in
one line (the checks themselves: tests/algorithms/test_validate.py and the packages' own tests)."""

from __future__ import annotations

import os

import pytest

from tempax.cli.main import main
from tests.algorithms.test_validate import _grpo_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_validate_exits_0_or_2_with_the_reason(tmp_path, capsys):
    assert main(["validate", _grpo_recipe(tmp_path, ["format", "correctness"])]) == 0
    assert "is a valid `tempax grpo` recipe" in capsys.readouterr().out
    assert main(["validate", _grpo_recipe(tmp_path, ["formatt"])]) == 2
    assert "did you mean 'format'" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run")  # validation writes nothing


def test_a_bad_tool_spec_is_one_line_from_the_command(tmp_path, monkeypatch, capsys):
    """`tempax validate RECIPE env.tools=[...]` with a function that has no type hints: exit 2 and one line."""
    from tempax.cli.main import main

    monkeypatch.chdir(ROOT)
    (tmp_path / "untyped.py").write_text('def price_of(item):\n    """Price.\n\n    Args:\n      item: name.\n    """\n')
    code = main(["validate", "recipes/grpo_price_tools.yaml", f"env.tools=[{tmp_path}/untyped.py:price_of]"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "parameter 'item' has no type hint" in err


def _sft_recipe(tmp_path, source: str, body: str = "") -> str:
    data = tmp_path / "chats.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(f"command: sft\nmodel:\n  source: {source}\ndata:\n  path: {data}\n{body}"
                      f"train:\n  steps: 1\n  run_dir: {tmp_path / 'run'}\n")
    return str(recipe)


def test_invalid_yaml_is_named_with_its_line_as_sft_names_it(tmp_path, capsys):
    """One over-indented line: validate said "cannot tell which command runs this recipe" where `tempax sft
    --config` says "not valid YAML at line 4"; both now give the YAML error."""
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("command: sft\nmodel:\n  source: preset:tiny-llama\n    tokenizer: smollm2-135m-instruct\n")
    assert main(["validate", str(recipe)]) == 2
    said = capsys.readouterr().err.strip()
    assert main(["sft", "--config", str(recipe)]) == 2
    assert said.replace("tempax validate", "tempax sft") == capsys.readouterr().err.strip()
    assert f"config file '{recipe}' is not valid YAML at line 4" in said and len(said.splitlines()) == 1


def test_an_unsupported_architecture_is_named_as_model_info_names_it(tmp_path, capsys):
    """A model folder whose config.json names an architecture tempax has no family for (and no tokenizer):
    validate said "no tokenizer"; it now names the architecture and the supported list, in model-info's words."""
    import json

    folder = tmp_path / "mamba"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}))
    assert main(["model-info", str(folder)]) == 2
    info_says = capsys.readouterr().err.strip().removeprefix("tempax model-info: error: ")
    assert "unsupported architecture model_type='mamba'" in info_says and "tempax supports: " in info_says
    assert main(["validate", _sft_recipe(tmp_path, str(folder))]) == 2
    assert capsys.readouterr().err.strip() == f"tempax validate: error: model.source: {info_says}"


def test_a_mistyped_recipe_path_gets_the_nearest_names(monkeypatch, capsys):
    """As a mistyped model name gets a did-you-mean: the nearest recipes, in the folder or the nearest folder."""
    monkeypatch.chdir(ROOT)
    assert main(["validate", "recipes/sft_lora_smolm2.yaml"]) == 2
    assert "does not exist; did you mean recipes/sft_lora_smollm2.yaml" in capsys.readouterr().err
    assert main(["sft", "--config", "recipe/sft_full_tiny.yml"]) == 2
    assert "does not exist; did you mean recipes/sft_full_tiny.yaml" in capsys.readouterr().err



def test_a_recipe_without_data_is_refused_naming_the_key(tmp_path, capsys):
    """tempax ships no default data set: every command whose config reads one (`data.path`) is refused by
    `tempax validate` in one line naming the key, and `tempax sft` stops with the same line before loading a model.
    The task-sampling commands need none (a generated task, or the Hub's GSM8K)."""
    from tempax.algorithms.registry import algorithms

    needs_data = []
    for command, algorithm in algorithms().items():
        recipe = tmp_path / f"{command}.yaml"
        recipe.write_text(f"command: {command}\ntrain: {{run_dir: {tmp_path / command}, steps: 1}}\n")
        data = getattr(algorithm.config_class()(), "data", None)
        if data is None or not hasattr(data, "path"):
            continue
        needs_data.append(command)
        assert data.path is None
        assert main(["validate", str(recipe)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"tempax validate: error: data.path is required: ") and len(err.splitlines()) == 1
    assert {"sft", "pretrain", "dpo", "kto", "reward-model", "ppo", "distill"} <= set(needs_data)
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(f"command: sft\nmodel: {{source: /no/such/model}}\ntrain: {{run_dir: {tmp_path / 'sft'}}}\n")
    assert main(["sft", "--config", str(recipe)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "tempax sft: error: data.path is required: the training rows, as a .jsonl/.json/.parquet file (gzip ok), a "
        "folder or a Hugging Face Hub dataset id; set it in the recipe (data: {path: ...}) or on the command line "
        "(data.path=...)")


@pytest.mark.heavy
def test_memory_gib_prints_the_plan_for_that_device_and_how_it_fits(tmp_path, capsys):
    """A full fine-tune of the Llama-3.2-1B shape at 8 x 1024 tokens (bf16, remat full), sized with a TPU's ops
    without loading a weight. On a 24 GiB device float32 moments on the device do not fit, so train.memory=auto
    settles on a setting that does and says so (exit 0). On a 15.75 GiB chip it fits with the state in host
    memory, streamed through the device one layer at a time: this recipe's loss holds whole rows of logits, so
    auto offloads the master too; the shape recipe's chunked loss leaves room with the optimizer's state alone
    offloaded (compiled for a v5e: 14.7 GiB, bench/memory_plan_v5e.py). On 6 GiB nothing fits and the plan names
    QLoRA (exit 2, as a run would refuse it)."""
    recipe = _sft_recipe(tmp_path, "preset:llama3.2-1b")
    over = ["train.batch_size=8", "train.seq_len=1024", "train.precision=bf16", "train.remat=full"]
    assert main(["validate", recipe, *over, "--memory-gib", "24", "--backend", "tpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("memory plan for a device of 24.00 GiB (tpu ops; micro-batch 8 x 1024 tokens")
    assert out[2].strip().startswith("train.memory=auto chose ")
    assert out[4].strip().startswith("fits: ~")
    assert main(["validate", recipe, *over, "--memory-gib", "15.75", "--backend", "tpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].strip().startswith("train.memory=auto chose offload_optimizer_and_master: ")
    assert out[4].strip().startswith("fits: ~")
    shape = os.path.join(ROOT, "recipes", "sft_shape_llama3.2-1b_lora.yaml")
    assert main(["validate", shape, "lora=null", *over, "--memory-gib", "15.75", "--backend", "tpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].strip().startswith("train.memory=auto chose offload_optimizer: ")
    assert out[4].strip().startswith("fits: ~")
    assert main(["validate", recipe, *over, "--memory-gib", "6", "--backend", "tpu"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[2].strip().startswith("train.memory=auto: no setting fits at micro-batch 8 and remat full")
    assert out[4].strip().startswith("does not fit; it would fit with: QLoRA")
    assert not os.path.exists(tmp_path / "run")


def test_memory_gib_on_a_lora_recipe_names_a_micro_batch_that_fits(tmp_path, capsys):
    """LoRA rank 16 on the 1B shape at 8 x 1024 without remat: the adapters' state is small, the activations are
    not; on a 15.75 GiB device the plan names a smaller micro-batch (or remat) that fits. A size that is not a
    size is refused."""
    recipe = _sft_recipe(tmp_path, "preset:llama3.2-1b", "lora:\n  rank: 16\n")
    over = ["train.batch_size=8", "train.seq_len=1024", "train.precision=bf16", "train.remat=none"]
    assert main(["validate", recipe, *over, "--memory-gib", "15.75", "--backend", "tpu"]) == 2
    out = capsys.readouterr().out
    assert "11.27M trained" in out and "train.micro_batch_size=" in out.splitlines()[-1]
    assert main(["validate", recipe, "--memory-gib", "0"]) == 2
    assert "--memory-gib must be a positive number" in capsys.readouterr().err
