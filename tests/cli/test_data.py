"""`tempax data clean|stats|episodes`: each subcommand end to end on small files (the work itself:
tests/data/test_clean.py, tests/data/test_stats.py, tests/envs/test_transcripts.py)."""

from __future__ import annotations

import json
import os

from tempax.cli.main import main
from tests.data.test_clean import _write_jsonl
from tests.data.test_stats import CHATS, _write
from tests.kit.tokenizers import tiny_chat_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_command_writes_the_shipped_warm_start_set(tmp_path, monkeypatch, capsys):
    """`tempax data episodes` with the price recipe and the scripted policy writes what examples/
    price_episodes.jsonl holds: all 48 task rows correct (the correctness reward scores each 1)."""
    monkeypatch.chdir(ROOT)
    out = str(tmp_path / "episodes.jsonl")
    assert main(["data", "episodes", "--config", "recipes/grpo_price_tools.yaml", "--policy",
                 "examples/price_tools.py:scripted_reply", "--out", out, "--min-reward", "1"]) == 0
    printed = capsys.readouterr().out.strip()
    assert "48 of 48 episodes (total reward >= 1.0); the longest reply takes" in printed
    assert "warning" not in printed  # the recipe's grpo.max_new_tokens holds every reply
    assert open(out).read() == open("examples/price_episodes.jsonl").read()


def test_cli_data_clean(tmp_path, capsys):
    from tempax.cli.main import main

    src = _write_jsonl(tmp_path / "in.jsonl", [{"text": "first document text"}, {"text": "first document text"}])
    out = str(tmp_path / "out.jsonl")
    assert main(["data", "clean", src, out, "near_dedup.enabled=false"]) == 0
    printed = capsys.readouterr().out
    assert "exact_duplicate" in printed and "report:" in printed
    report = json.load(open(out + ".report.json"))
    assert report["kept"] == 1 and report["config"]["near_dedup"]["enabled"] is False
    assert main(["data", "clean", src]) == 2  # neither OUT nor --dry-run: a clear message, exit status 2
    assert "needs OUT" in capsys.readouterr().err
    # Options before IN, and overrides after an option, both work.
    assert main(["data", "clean", "--dry-run", src, "--report", str(tmp_path / "r.json"), "exact_dedup=false",
                 "near_dedup.enabled=false"]) == 0
    assert json.load(open(tmp_path / "r.json"))["kept"] == 2


def test_cli_data_clean_in_place_needs_overwrite(tmp_path, capsys):
    """`tempax data clean IN IN` rewrote its own input unasked; now it is refused (exit 2, naming --overwrite) with
    IN untouched, and with --overwrite IN holds the cleaned rows. An existing report is refused the same way."""
    src = _write_jsonl(tmp_path / "in.jsonl", [{"text": "first document text"}, {"text": "first document text"}])
    original = open(src).read()
    assert main(["data", "clean", src, src, "near_dedup.enabled=false"]) == 2
    err = capsys.readouterr().err
    assert f"OUT {src} is IN: cleaning would replace the input" in err and "--overwrite" in err
    assert open(src).read() == original and os.listdir(tmp_path) == ["in.jsonl"]
    assert main(["data", "clean", src, src, "--overwrite", "near_dedup.enabled=false"]) == 0
    assert open(src).read() == '{"text": "first document text"}\n'
    assert json.load(open(src + ".report.json"))["kept"] == 1
    out = str(tmp_path / "out.jsonl")
    assert main(["data", "clean", src, out, "--report", src + ".report.json"]) == 2
    assert f"report {src}.report.json exists" in capsys.readouterr().err and not os.path.exists(out)


def test_cli_data_stats(tmp_path, capsys):
    from tempax.cli.main import main

    tok_dir = str(tmp_path / "tok")
    tiny_chat_tokenizer().hf.save_pretrained(tok_dir)
    path = _write(tmp_path / "chat.jsonl", CHATS)
    png = str(tmp_path / "plots" / "lengths.png")
    assert main(["data", "stats", path, "--model", tok_dir, "--seq-len", "50", "--png", png, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 3 and out["share_longer_than_50"] == round(1 / 3, 4) and os.path.isfile(png)
