"""`tempax tokenizer train`: the trained tokenizer's report and folder (the training itself:
tests/data/test_tokenizer_train.py)."""

from __future__ import annotations

from tempax.models.tokenizer import load_tokenizer
from tests.data.test_tokenizer_train import CORPUS, HELD_OUT


def test_cli_tokenizer_train(tmp_path, capsys):
    import json

    from tempax.cli.main import main

    corpus, held = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    held.write_text("".join(json.dumps({"text": t}) + "\n" for t in HELD_OUT))
    out_dir = str(tmp_path / "tok")
    assert main(["tokenizer", "train", str(corpus), "--vocab-size", "300", "--out", out_dir,
                 "--heldout", str(held)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["vocab_size"] == 300 and report["roundtrip_exact"] == report["heldout_texts"] == 3
    assert load_tokenizer(out_dir).vocab_size == 300


def test_tokenizer_train_prints_only_eos_as_a_stop_id(tmp_path, capsys):
    """Ids 0 / 1 / 2 are pad <|endoftext|> / bos <|im_start|> / eos <|im_end|>: a reply ends at eos (2); the pad
    (0) fills the end of rows and is not a stop id, in the printed report and after the folder is loaded again."""
    import json

    from tempax.cli.main import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(CORPUS))
    assert main(["tokenizer", "train", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "tok")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["pad_id"], report["eos_id"], report["stop_ids"]) == (0, 2, [2])
    assert load_tokenizer(str(tmp_path / "tok")).stop_ids == (2,)
