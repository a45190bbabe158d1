"""`tempax score`: rates (prompt, response) pairs and preference pairs with a saved reward model; bad rows are
skipped, counted and reported; user mistakes exit with status 2 and a message."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import nnx

from tempax.cli.main import main as cli
from tempax.models.reward_model import RewardModel, save_reward_model
from tests.eval.test_scoring import SMALL, rm_folder, scorer  # noqa: F401  (the fixtures: a tiny reward model)
from tests.kit.models import tiny_tempax_model
from tests.kit.tokenizers import tiny_chat_tokenizer

def test_command_line_pairs_match_the_scorer(rm_folder, scorer, capsys):  # noqa: F811
    code = cli(["score", rm_folder, "--prompt", "What is bread?", "--response", "Flour, water, salt and yeast.",
                "--prompt", "Capital of France?", "--response", "Paris."])
    assert code == 0
    out, err = capsys.readouterr()
    printed = [float(line.split("\t")[0]) for line in out.strip().splitlines()]
    expected = scorer(["What is bread?", "Capital of France?"], ["Flour, water, salt and yeast.", "Paris."])
    np.testing.assert_allclose(printed, expected, atol=1e-4)
    assert json.loads(err.strip().splitlines()[-1])["num_scored"] == 2


def test_input_file_with_pairs_singles_and_bad_rows(rm_folder, scorer, tmp_path, capsys):  # noqa: F811
    rows = [
        {"prompt": "hi", "response": "hello there"},
        {"prompt": [{"role": "user", "content": "hi"}], "completion": "hey"},
        {"prompt": "Say yes.", "chosen": "Yes.", "rejected": "No."},
        {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!", "rejected": "\n\nHuman: Hi\n\nAssistant: Go away."},
        {"prompt": "hi"},                                                      # no response: skipped
        {"prompt": "hi", "chosen": "", "rejected": "no"},                      # empty response: skipped
        {"chosen": "\n\nHuman: hello", "rejected": "\n\nHuman: hello again"},  # no assistant turn: skipped
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    out_path = tmp_path / "out" / "scores.jsonl"
    assert cli(["score", rm_folder, "--input", str(path), "--output", str(out_path)]) == 0
    _, err = capsys.readouterr()
    records = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert len(records) == 4
    assert records[0]["score"] == pytest.approx(scorer(["hi"], ["hello there"])[0], abs=1e-4)
    c, r = scorer(["Say yes.", "Say yes."], ["Yes.", "No."])
    assert records[2]["chosen_score"] == pytest.approx(c, abs=1e-4)
    assert records[2]["rejected_score"] == pytest.approx(r, abs=1e-4)
    assert "skipped 4" in err and "missing_field" in err and "no_assistant_turn" in err and "empty_response" in err
    summary = json.loads(err.strip().splitlines()[-1])
    assert summary["num_scored"] == 2 and summary["num_pairs"] == 2 and 0.0 <= summary["accuracy"] <= 1.0


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "a"], "pass them in pairs"),
    ([], "nothing to score"),
])
def test_user_mistakes_exit_2_with_a_message(rm_folder, capsys, argv, message):  # noqa: F811
    assert cli(["score", rm_folder, *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_folder_that_is_not_a_reward_model(tmp_path, capsys):
    assert cli(["score", str(tmp_path), "--prompt", "a", "--response", "b"]) == 2
    assert "not a tempax reward model" in capsys.readouterr().err


def test_limit_scores_the_first_rows_under_a_labelled_bar(rm_folder, tmp_path, capsys, monkeypatch):  # noqa: F811
    """--limit 3 of 10 rows: three scores, one line saying so, and (on a terminal) a bar naming the file."""
    import tempax.progress

    monkeypatch.setattr(tempax.progress, "on_terminal", lambda: True)
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Q{i}?", "response": f"A{i}."}) + "\n" for i in range(10)))
    assert cli(["score", rm_folder, "--input", str(path), "--limit", "3", "--batch-size", "2"]) == 0
    out, err = capsys.readouterr()
    assert len(out.strip().splitlines()) == 3
    assert f"tempax score: scoring the first 3 rows of {path} (--limit 3)" in err
    assert "scoring pairs.jsonl:   0%|" in err and "0/3 [" in err  # tqdm: the label, the total, then an ETA
    assert json.loads(err.strip().splitlines()[-1])["num_scored"] == 3
    assert cli(["score", rm_folder, "--input", str(path), "--limit", "0"]) == 2
    assert "--limit must be >= 1, got 0" in capsys.readouterr().err


def test_a_reward_model_run_dir_is_scored_with_the_model_it_saved(tmp_path, capsys):
    """`tempax score RUN_DIR` reads `RUN_DIR/reward_model` (what `tempax reward-model` writes at its end); a run dir
    without one is a single line naming the command that writes it."""
    run = tmp_path / "rm_run"
    model = RewardModel(tiny_tempax_model("llama", **SMALL), rngs=nnx.Rngs(2))
    save_reward_model(model, str(run / "reward_model"), tokenizer=tiny_chat_tokenizer().hf, extra={"max_length": 64})
    (run / "config.yaml").write_text("reward: {}\n")
    pair = ["--prompt", "Capital of France?", "--response", "Paris."]
    assert cli(["score", str(run), *pair]) == 0
    from_run = capsys.readouterr().out
    assert cli(["score", str(run / "reward_model"), *pair]) == 0
    assert from_run == capsys.readouterr().out and from_run.strip()
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text("reward: {}\n")
    assert cli(["score", str(unfinished), *pair]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"tempax reward-model --config {unfinished}/config.yaml" in err
