"""The training commands (`tempax sft|pretrain|dpo|kto|reward-model|grpo|...`), and `validate`, `plot` and `export`
on their runs, through the real CLI entry point on a tiny model: a registered algorithm's command, the recipe
listing without one, `--print-config`, the done line and exit status 3 for a run a hook stopped."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax.algorithms.registry import algorithms
from tempax.cli.main import main
from tempax.train.metrics import read_metrics
from tests.algorithms.grpo.test_objective import tok  # noqa: F401  (the fixture: the tiny chat tokenizer)
from tests.algorithms.test_registry import toy  # noqa: F401  (the fixture: the toy algorithm, registered)
from tests.kit.tokenizers import tiny_chat_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DIALOGUES = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [{"role": "user", "content": "How do I bake bread?"}, {"role": "assistant", "content": "Mix flour and water."}],
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    tok = root / "tok"
    tiny_chat_tokenizer().hf.save_pretrained(tok)
    data = root / "train.jsonl"
    with open(data, "w") as f:
        for i in range(8):
            f.write(json.dumps({"messages": DIALOGUES[i % 2]}) + "\n")
    text = root / "text.jsonl"
    with open(text, "w") as f:
        for i in range(8):
            f.write(json.dumps({"question": f"What is {i} + 1?", "answer": f"It is {i + 1}."}) + "\n")
    recipe = root / "tiny_lora.yaml"
    recipe.write_text(
        f"""# A tiny LoRA SFT run for the CLI tests.
# Run: tempax sft --config {recipe}
command: sft
model:
  source: preset:tiny-llama
  tokenizer: {tok}
  overrides: {{vocab_size: 400, num_layers: 1}}
lora:
  rank: 4
  alpha: 8
  target_modules: [q_proj, v_proj]
data:
  path: {data}
  packing: false
train:
  steps: 3
  batch_size: 4
  seq_len: 32
  progress_bar: false
  tensorboard: false
  run_dir: {root / "run"}
  mesh: {{num_devices: 1}}
  optimizer: {{learning_rate: 0.05, schedule: constant}}
"""
    )
    return root, recipe, text


@pytest.fixture(scope="module")
def trained(workspace):
    root, recipe, _ = workspace
    assert main(["sft", "--config", str(recipe), "train.steps=3"]) == 0
    return root / "run"


def test_sft_command_trains_and_writes_the_run_dir(trained):
    lines = (trained / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(l)["step"] for l in lines] == [1, 2, 3]
    assert os.path.isdir(trained / "checkpoints" / "3")
    config = (trained / "config.yaml").read_text()
    assert config.startswith("command: sft\n") and "tiny-llama" in config


@pytest.mark.heavy
def test_a_run_saved_before_config_yaml_named_its_command_loads_the_same(trained, tmp_path):
    """A run dir written the old way (config.yaml without its `command:` line) is recognised from its config's
    shape and gives the same model, step and tokenizer as the run dir as written now."""
    import shutil

    from tempax.algorithms.run_dirs import describe, load_run

    older = tmp_path / "older"
    shutil.copytree(trained, older, ignore=shutil.ignore_patterns(".tempax-run.lock"))
    (older / "config.yaml").write_text((trained / "config.yaml").read_text().removeprefix("command: sft\n"))
    assert "command:" not in (older / "config.yaml").read_text()
    assert describe(str(older)) == describe(str(trained))
    now, before = load_run(str(trained)), load_run(str(older))
    tokens = jnp.asarray(np.arange(12, dtype=np.int32).reshape(2, 6) + 5)
    assert before.step == now.step == 3
    np.testing.assert_array_equal(before.model(tokens)[0], now.model(tokens)[0])
    assert before.tokenizer.encode("Paris.") == now.tokenizer.encode("Paris.")


def test_unknown_key_names_it_and_its_neighbours(workspace, capsys):
    _, recipe, _ = workspace
    assert main(["sft", "--config", str(recipe), "train.optimizer.learnig_rate=1e-3"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'train.optimizer.learnig_rate'" in err and "train.optimizer.learning_rate" in err
    assert main(["sft", "--config", str(recipe), "train.stpes=2"]) == 2
    assert "'train.steps'" in capsys.readouterr().err


def test_print_config_and_validate(workspace, capsys):
    _, recipe, _ = workspace
    assert main(["sft", "--config", str(recipe), "train.steps=7", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "steps: 7" in out and "rank: 4" in out
    assert main(["validate", str(recipe)]) == 0
    assert "valid `tempax sft` recipe" in capsys.readouterr().out
    assert main(["validate", str(recipe), "data.path=/no/such/file.jsonl"]) == 2
    assert "/no/such/file.jsonl" in capsys.readouterr().err


def test_plot_writes_a_png(trained, capsys):
    assert main(["plot", str(trained)]) == 0
    path = capsys.readouterr().out.strip()
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.heavy
def test_export_merges_adapters_into_a_hf_checkpoint(trained, tmp_path):
    """The exported plain model gives the trained LoRA model's logits; the adapters-only export is PEFT-shaped."""
    from tempax.models.hf_io import load_hf_checkpoint
    from tempax.models.lora import has_adapters
    from tempax.algorithms.run_dirs import load_run

    out = tmp_path / "hf"
    assert main(["export", str(trained), str(out)]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
    run = load_run(str(trained), merge=False)
    lora_model, meta = run.model, run.meta
    assert meta["trainable"] == "adapters" and has_adapters(lora_model) and run.step == 3
    exported = load_hf_checkpoint(str(out))
    tokens = jnp.asarray(np.arange(12, dtype=np.int32).reshape(2, 6) + 5)
    assert_allclose(exported(tokens)[0], lora_model(tokens)[0], atol=1e-4)
    assert main(["export", str(trained), str(tmp_path / "adapters"), "--adapters"]) == 0
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(tmp_path / "adapters"))


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    """The trained run exported to a Hugging Face folder: what a run dir given as a model must equal."""
    out = tmp_path_factory.mktemp("exported") / "hf"
    assert main(["export", str(trained), str(out)]) == 0
    return out


def _generated(capsys, *argv: str) -> list[dict]:
    assert main(["generate", *argv, "--prompt", "What is the capital?", "--prompt", "Bread?", "--max-new-tokens",
                 "6", "--temperature", "0", "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.heavy
def test_generate_and_serve_take_the_run_dir_as_its_export(trained, exported, capsys):
    """`tempax generate RUN_DIR` samples from the run's newest checkpoint with the adapters merged: greedy tokens
    equal those of the same run exported to a Hugging Face folder; `serve` loads a run dir the same way."""
    from tempax.cli.generate import load_source
    from tempax.models.hf_io import load_hf_checkpoint

    capsys.readouterr()
    from_run = _generated(capsys, str(trained))
    assert len(from_run) == 2 and from_run == _generated(capsys, str(exported))
    served, tokenizer = load_source(str(trained))  # what `tempax serve RUN_DIR` serves
    tokens = jnp.asarray(np.arange(12, dtype=np.int32).reshape(2, 6) + 5)
    assert_allclose(served(tokens)[0], load_hf_checkpoint(str(exported))(tokens)[0], atol=1e-4)
    assert tokenizer.encode("Paris.") == tiny_chat_tokenizer().encode("Paris.")


def test_eval_and_model_info_take_a_run_dir(trained, capsys):
    assert main(["eval", str(trained), "--task", "arithmetic", "--num-problems", "2", "--max-new-tokens", "4",
                 "--batch-size", "2"]) == 0
    assert "2 arithmetic problems (test)" in capsys.readouterr().out
    assert main(["model-info", str(trained), "--json"]) == 0
    out, err = capsys.readouterr()
    info = json.loads(out)
    assert (info["layers"], info["vocab"], info["source"]) == (1, 400, "preset:tiny-llama")
    assert f"{trained} is a training run" in err


@pytest.mark.heavy
def test_a_run_dir_is_the_model_source_of_a_second_run(workspace, trained, exported, tmp_path):
    """A recipe's model.source=RUN_DIR starts from the run's trained weights, adapters merged (the model its export
    holds), and a run started so is a model source in turn (the chain is followed to its start)."""
    from tempax.algorithms.common import ModelSourceConfig
    from tempax.models.hf_io import load_hf_checkpoint

    _, recipe, _ = workspace
    start, tokenizer = ModelSourceConfig(source=str(trained)).build()
    tokens = jnp.asarray(np.arange(12, dtype=np.int32).reshape(2, 6) + 5)
    assert_allclose(start(tokens)[0], load_hf_checkpoint(str(exported))(tokens)[0], atol=1e-4)
    assert tokenizer.encode("Paris.") == tiny_chat_tokenizer().encode("Paris.")
    second = tmp_path / "second"
    assert main(["sft", "--config", str(recipe), f"model.source={trained}", "model.tokenizer=null",
                 "model.overrides={}", f"train.run_dir={second}", "train.steps=1"]) == 0
    assert f"source: {trained}" in (second / "config.yaml").read_text()
    assert main(["generate", str(second), "--prompt", "hi", "--max-new-tokens", "2"]) == 0


def test_a_run_dir_without_a_checkpoint_is_one_line_naming_the_command(workspace, tmp_path, capfd):
    _, recipe, _ = workspace
    run = tmp_path / "fresh"
    assert main(["sft", "--config", str(recipe), f"train.run_dir={run}", "--print-config"]) == 0
    run.mkdir()
    (run / "config.yaml").write_text(capfd.readouterr().out)
    for argv in (["generate", str(run), "--prompt", "hi"], ["eval", str(run), "--task", "arithmetic"],
                 ["export", str(run), str(tmp_path / "out")],
                 ["sft", "--config", str(recipe), f"model.source={run}", "model.tokenizer=null", "model.overrides={}",
                  f"train.run_dir={tmp_path / 'next'}"]):
        assert main(argv) == 2, argv
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"{run} has no checkpoint yet" in err and f"tempax sft --config {run}/config.yaml" in err, err


def test_export_writes_every_file_with_the_same_permissions(trained, tmp_path):
    """Under umask 022 every exported file is 0644: the weights were 0600 (safetensors' private temporary file)
    beside 0644 config and tokenizer files, unreadable to anyone serving the folder."""
    import stat

    old = os.umask(0o022)
    try:
        assert main(["export", str(trained), str(tmp_path / "hf")]) == 0
        assert main(["export", str(trained), str(tmp_path / "adapters"), "--adapters"]) == 0
    finally:
        os.umask(old)
    modes = {f"{d}/{name}": oct(stat.S_IMODE(os.stat(tmp_path / d / name).st_mode))
             for d in ("hf", "adapters") for name in os.listdir(tmp_path / d)}
    assert "hf/model.safetensors" in modes and "adapters/adapter_model.safetensors" in modes
    assert set(modes.values()) == {"0o644"}, modes


@pytest.mark.heavy
def test_pretrain_command_on_text_fields(workspace, tmp_path):
    _, recipe, text = workspace  # an SFT recipe (command: sft) whose settings fit continued pre-training too
    run = tmp_path / "pt"
    assert main(["pretrain", "--config", str(recipe), f"data.path={text}", "data.text_fields=[question, answer]",
                 "data.format=text", "data.train_on=all", f"train.run_dir={run}", "train.steps=2", "lora=null",
                 "train.checkpoint.save_at_end=false"]) == 0
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and records[0]["num_tokens"] > 0


def test_a_run_stopped_by_a_hook_exits_with_status_3(workspace, monkeypatch, capsys):
    """The CLI maps `TrainResult.stop_reason` to exit status 3 (documented in `tempax --help`) and prints it."""
    from tempax.algorithms.run import RunResult
    from tempax.cli import train_cmds
    from tempax.cli.main import EXIT_STATUSES

    _, recipe, _ = workspace
    cls, _ = train_cmds.resolve("sft")
    monkeypatch.setattr(train_cmds, "resolve", lambda command: (cls, lambda cfg: RunResult(None, stop_reason="why")))
    assert main(["sft", "--config", str(recipe)]) == train_cmds.STOPPED_EXIT_STATUS == 3
    assert "stopped early: why" in capsys.readouterr().err
    assert "3    a training hook stopped the run early" in EXIT_STATUSES


@pytest.mark.parametrize("command", sorted(algorithms()))
def test_every_training_command_ends_with_the_same_done_line(workspace, monkeypatch, capsys, command, tmp_path):
    """Every registered command's `main` returns a `RunResult` (tests/algorithms/test_registry.py checks the
    mains); from it the command's last line says the step, its loss and where the run went."""
    from tempax.algorithms.run import RunResult
    from tempax.cli import train_cmds

    cls, _ = train_cmds.resolve(command)
    outcome = RunResult(None, history=[(4, {"loss": 0.5})])
    monkeypatch.setattr(train_cmds, "resolve", lambda name: (cls, lambda cfg: outcome))
    run_dir = tmp_path / "run"
    assert main([command, f"train.run_dir={run_dir}", "train.steps=4"]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"done: step 4, loss 0.5000; run dir {run_dir} (curves: tempax plot {run_dir})"


@pytest.mark.slow  # about 100 s on 2 cores: two real runs with their held-out evaluations
def test_dpo_and_kto_commands_end_with_the_done_line(tmp_path, capsys):
    """Two real steps of `tempax dpo` and `tempax kto` on a one-layer model print the line as their last."""
    from tests.algorithms.preference.test_dpo import SEQ, SMALL, synthetic_rows, write_jsonl

    tiny_chat_tokenizer().hf.save_pretrained(tmp_path / "tok")
    pairs = write_jsonl(str(tmp_path / "pairs.jsonl"), synthetic_rows(16, seed=0))
    overrides = ", ".join(f"{k}: {v}" for k, v in SMALL.items())
    for command in ("dpo", "kto"):
        run_dir = tmp_path / command
        assert main([command, "model.source=preset:tiny-llama", f"model.tokenizer={tmp_path / 'tok'}",
                     f"model.overrides={{{overrides}}}", f"data.path={pairs}", f"data.eval_path={pairs}", "train.steps=2", "train.batch_size=4",
                     f"train.seq_len={SEQ}", f"train.run_dir={run_dir}", "train.progress_bar=false",
                     "train.tensorboard=false", "train.mesh.num_devices=1", "train.checkpoint.save_at_end=false",
                     "eval.before=false"]) == 0
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("done: step 2, loss ") and last.endswith(f"; run dir {run_dir} (curves: tempax plot "
                                                                       f"{run_dir})")


def test_validate_takes_a_run_dir_as_model_source(workspace, trained, tmp_path, capsys):
    _, recipe, _ = workspace
    overrides = [f"model.source={trained}", "model.tokenizer=null", "model.overrides={}"]
    assert main(["validate", str(recipe), *overrides]) == 0
    assert "valid `tempax sft` recipe" in capsys.readouterr().out
    reward_run = tmp_path / "rm"
    reward_run.mkdir()
    (reward_run / "config.yaml").write_text("reward: {}\nmodel: {source: preset:tiny-llama}\n")
    assert main(["validate", str(recipe), f"model.source={reward_run}", "model.tokenizer=null",
                 "model.overrides={}"]) == 2
    assert f"model.source: {reward_run} is a reward-model run" in capsys.readouterr().err


def test_training_command_without_a_recipe_refuses_and_lists_the_recipes(capsys):
    assert main(["sft"]) == 2
    err = capsys.readouterr().err
    assert "tempax sft needs a recipe: --config RECIPE (recipes/sft_full_tiny.yaml, recipes/sft_lora_smollm2" in err
    assert "model smollm2-135m-instruct, full fine-tuning, 100 steps of 8 x 512 tokens" in err
    assert main(["sft", "--print-config"]) == 0  # looking at the defaults needs no recipe
    assert "run_dir: runs/run" in capsys.readouterr().out


@pytest.mark.slow
def test_the_cli_exits_3_when_the_collapse_guard_stops_a_run(tok, tmp_path, capsys):  # noqa: F811
    """`tempax grpo ... guard.action=stop` with a guard that fires at once (min_entropy 100 nats, window 1):
    the run stops after step 1 of 3 with a checkpoint, the reason in summary.json, and exit status 3."""
    import json

    from tempax.cli.main import main as cli

    tok_dir = tmp_path / "tokenizer"
    tok.hf.save_pretrained(str(tok_dir))
    run_dir = tmp_path / "run"
    status = cli([
        "grpo", "model.source=preset:tiny-llama", f"model.tokenizer={tok_dir}", "model.overrides={vocab_size: 400}",
        "lora.rank=2", "lora.alpha=4", "task.name=arithmetic", "task.num_train_problems=8", "grpo.group_size=2",
        "grpo.max_new_tokens=4", "eval.num_problems=0", "train.steps=3", "train.batch_size=2",
        "train.mesh.num_devices=1", f"train.run_dir={run_dir}", "train.progress_bar=false", "train.tensorboard=false",
        "train.check_memory=false", "guard.action=stop", "guard.min_entropy=100", "guard.window=1",
    ])
    assert status == 3
    assert "stopped early: collapse guard at step 1: entropy collapse" in capsys.readouterr().err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 1 and summary["stop_reason"].startswith("collapse guard at step 1")
    assert (run_dir / "checkpoints" / "1").is_dir()


def test_dpo_print_config_shows_the_overrides(capsys):
    """`tempax dpo --config RECIPE --print-config key=value` shows the overrides in the resolved config."""
    from tempax.cli.main import main as cli

    assert "dpo" in algorithms()
    recipe = os.path.join(ROOT, "recipes", "dpo_smollm2_lora.yaml")
    assert cli(["dpo", "--config", recipe, "--print-config", "dpo.loss=simpo", "dpo.beta=2.0"]) == 0
    printed = capsys.readouterr().out
    assert "loss: simpo" in printed and "reference: adapters_off" in printed


def test_kto_print_config_shows_the_overrides(capsys):
    from tempax.cli.main import main as cli

    recipe = os.path.join(ROOT, "recipes", "kto_smollm2_lora.yaml")
    assert cli(["kto", "--config", recipe, "--print-config", "kto.desirable_weight=1.33"]) == 0
    printed = capsys.readouterr().out
    assert "desirable_weight: 1.33" in printed and "convert_pairs: true" in printed


def test_reward_model_print_config_shows_the_overrides(capsys):
    """`tempax reward-model --config RECIPE --print-config key=value` shows the override in the resolved config."""
    from tempax.cli.main import main as cli

    assert "reward-model" in algorithms()
    recipe = os.path.join(ROOT, "recipes", "reward_model_smollm2_lora.yaml")
    assert cli(["reward-model", "--config", recipe, "--print-config", "reward.margin=0.5"]) == 0
    assert "margin: 0.5" in capsys.readouterr().out


@pytest.mark.heavy
def test_a_registered_toy_algorithm_is_listed_validated_and_trains_two_steps(toy, tmp_path, capsys):  # noqa: F811
    from tempax.cli.main import main as cli

    with pytest.raises(SystemExit) as exit_info:
        cli(["--help"])
    assert exit_info.value.code == 0
    assert "toy" in capsys.readouterr().out

    tok = tmp_path / "tokenizer"
    tiny_chat_tokenizer().hf.save_pretrained(str(tok))
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus 1?"},
                                                     {"role": "assistant", "content": f"{i + 1}."}]}) + "\n"
                            for i in range(8)))
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(f"""# The toy algorithm on eight tiny chats.
# Run: tempax toy --config {recipe}
command: toy
model: {{source: preset:tiny-llama, tokenizer: {tok}, overrides: {{vocab_size: 400, num_layers: 1}}}}
data: {{path: {data}, packing: false}}
train:
  steps: 2
  batch_size: 2
  seq_len: 32
  run_dir: {tmp_path / "run"}
  progress_bar: false
  tensorboard: false
  mesh: {{num_devices: 1}}
  checkpoint: {{save_at_end: false}}
""")
    assert cli(["validate", str(recipe)]) == 0
    assert "valid `tempax toy` recipe" in capsys.readouterr().out
    assert cli(["toy", "--config", str(recipe)]) == 0
    records = [r for r in read_metrics(str(tmp_path / "run")) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert all(jnp.isfinite(r["loss"]) for r in records)
