"""`tempax recommend`: the recipe it writes for a data file validates and runs with the command it names (the
decisions themselves: tests/algorithms/test_recommend.py)."""

from __future__ import annotations

import json
import os

import pytest

from tempax.algorithms.recommend import recommend, write_recipe
from tempax.train.memory import GiB


def test_cli_recommend_on_raw_text(tmp_path, capsys, monkeypatch):
    from tempax.cli.main import main

    monkeypatch.chdir(tmp_path)
    with open("notes.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"Field note {i}: the river rose {i} cm overnight after the storm."}) + "\n")
    assert main(["recommend", "notes.jsonl", "--memory-gib", "16", "--out", "rec.yaml", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["command"] == "pretrain" and out["data"]["kind"] == "text" and out["data"]["rows"] == 40
    assert main(["validate", "rec.yaml"]) == 0
    assert "valid `tempax pretrain` recipe" in capsys.readouterr().out
    with open("rec.yaml") as f:
        assert "# Run:  tempax pretrain --config rec.yaml" in f.read()


@pytest.mark.heavy
@pytest.mark.parametrize("kind", ["messages", "text"])
def test_written_recipe_runs(tmp_path, monkeypatch, kind):
    """The recipe `recommend` writes for a tiny checkpoint runs with the command it names (2 steps)."""
    from tempax.cli.main import main
    from tempax.data.stats import profile_dataset
    from tempax.models.hf_io import save_hf_checkpoint
    from tests.kit.models import tiny_tempax_model
    from tests.kit.tokenizers import tiny_chat_tokenizer

    monkeypatch.chdir(tmp_path)
    tok = tiny_chat_tokenizer()
    folder = save_hf_checkpoint(tiny_tempax_model("llama", vocab_size=tok.vocab_size), str(tmp_path / "tiny"),
                                tokenizer=tok)
    with open("rows.jsonl", "w") as f:
        for i in range(20):
            row = ({"messages": [{"role": "user", "content": f"What is {i} + 1?"},
                                 {"role": "assistant", "content": f"It is {i + 1}."}]} if kind == "messages"
                   else {"text": f"Note {i}: the quick brown fox jumps over the lazy dog."})
            f.write(json.dumps(row) + "\n")
    profile = profile_dataset("rows.jsonl", tok)
    rec = recommend(profile, tiny_tempax_model("llama").config, model_source=folder, capacity=8 * GiB,
                    run_dir=str(tmp_path / "run"))
    assert rec.command == ("sft" if kind == "messages" else "pretrain")
    path = write_recipe(rec, "rec.yaml")
    assert main([rec.command, "--config", path, "train.steps=2", "train.progress_bar=false",
                 "train.tensorboard=false", "train.mesh.num_devices=1", "train.checkpoint.save_at_end=false"]) == 0
    assert os.path.isfile(tmp_path / "run" / "metrics.jsonl")
