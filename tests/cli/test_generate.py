"""`tempax generate` and `tempax chat` on a tiny checkpoint folder (tiny llama + the tiny chat tokenizer)."""

from __future__ import annotations

import io
import json

import pytest

from tempax.cli.main import main
from tempax.generate import SamplingConfig, generate
from tempax.models.hf_io import save_hf_checkpoint
from tempax.models.registry import load
from tests.generate.conftest import peaked_tiny_model
from tests.kit.tokenizers import tiny_chat_tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tiny-chat"))
    return save_hf_checkpoint(peaked_tiny_model(), folder, tokenizer=tiny_chat_tokenizer())


def _json_rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_generate_prints_json_completions(checkpoint, capsys):
    """2 prompts x n=2 samples: four JSON rows whose text, ids and log-probs equal the library call's."""
    argv = ["generate", checkpoint, "--prompt", "The quick brown", "--prompt", "Hello", "--n", "2",
            "--max-new-tokens", "6", "--temperature", "0.8", "--top-p", "0.9", "--seed", "5", "--json", "--raw"]
    assert main(argv) == 0
    rows = _json_rows(capsys.readouterr().out)
    assert [(r["prompt_index"], r["sample"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    model, tokenizer = load(checkpoint, progress=False)
    expected = generate(model, tokenizer, ["The quick brown", "Hello"],
                        SamplingConfig(max_new_tokens=6, temperature=0.8, top_p=0.9, seed=5, n=2))
    for r, row in enumerate(rows):
        n = int(expected.lengths[r])
        assert row["text"] == expected.texts[r]
        assert row["token_ids"] == expected.token_ids[r, :n].tolist()
        assert row["logprobs"] == pytest.approx(expected.logprobs[r, :n].tolist(), abs=1e-5)
        assert row["finish_reason"] == expected.finish_reasons[r]


def test_generate_plain_text_with_chat_template(checkpoint, capsys):
    argv = ["generate", checkpoint, "--prompt", "hello", "--chat", "--system", "Be brief.", "--temperature", "0",
            "--max-new-tokens", "5"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("[0] 'hello'\n")
    assert "tokens in" in captured.err


def test_generate_uses_the_chat_template_by_default(checkpoint, capsys):
    """A plain prompt to a model with a chat template goes through the template (like `ollama run`): the same
    completion as --chat, and the ids of the templated prompt are what the model saw; --raw sends the text."""
    base = ["generate", checkpoint, "--prompt", "hello", "--temperature", "0", "--max-new-tokens", "5", "--json"]
    assert main(base) == 0
    default = capsys.readouterr()
    assert "prompts sent through the chat template; --raw sends them as written" in default.err
    assert main(base + ["--chat"]) == 0
    chat = capsys.readouterr()
    assert main(base + ["--raw"]) == 0
    raw = capsys.readouterr()
    assert "prompts sent as written" in raw.err
    (d,), (c,), (r,) = _json_rows(default.out), _json_rows(chat.out), _json_rows(raw.out)
    assert d == c and d["chat_template"] and not r["chat_template"]
    model, tokenizer = load(checkpoint, progress=False)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                        tokenize=True)
    expected = generate(model, tokenizer, [ids], SamplingConfig(max_new_tokens=5, temperature=0.0))
    assert d["token_ids"] == expected.token_ids[0, : int(expected.lengths[0])].tolist()
    assert main(base + ["--raw", "--system", "Be brief."]) == 2
    assert "drop --raw" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--top-p", "0"], "top_p must lie in (0, 1]"),
        (["--max-new-tokens", "0"], "max_new_tokens must be a positive integer"),
        (["--n", "0"], "n (samples per prompt)"),
        (["--prompt", ""], "prompt 0 is empty"),
        (["--max-new-tokens", "300"], "context holds 256"),
    ],
)
def test_generate_bad_input_is_a_clear_error(checkpoint, capsys, extra, message):
    argv = ["generate", checkpoint, *(["--prompt", "hi"] if "--prompt" not in extra else []), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tempax generate: error:") and message in err


def test_generate_without_prompt(checkpoint, capsys):
    assert main(["generate", checkpoint]) == 2
    assert "no prompt given" in capsys.readouterr().err


def test_chat_streams_replies_with_the_template(checkpoint, capsys, monkeypatch):
    """Two turns and a reset: each reply is what `generate` gives for the templated history (the seed moves on
    by one per turn)."""
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nwhat next?\n/reset\n"))
    argv = ["chat", checkpoint, "--temperature", "0.7", "--max-new-tokens", "8", "--seed", "3", "--chunk", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    replies = [part.split("\nyou> ")[0] for part in out.split("assistant> ")[1:]]
    assert len(replies) == 2 and "(conversation cleared)" in out
    model, tok = load(checkpoint, progress=False)
    history = []
    for turn, (question, reply) in enumerate(zip(["hello", "what next?"], replies)):
        history.append({"role": "user", "content": question})
        ids = tok.apply_chat_template(history, add_generation_prompt=True, tokenize=True)
        config = SamplingConfig(max_new_tokens=8, temperature=0.7, seed=3 + turn)
        assert reply == generate(model, tok, [ids], config).texts[0]
        history.append({"role": "assistant", "content": reply})
