"""`tempax serve` refuses impossible settings with exit status 2 and a message naming the flag."""

from __future__ import annotations

import socket

from tempax.cli.main import main
from tempax.models.hf_io import save_hf_checkpoint
from tests.generate.conftest import peaked_tiny_model
from tests.kit.tokenizers import tiny_chat_tokenizer


def test_serve_refuses_a_context_beyond_the_model_and_a_busy_port(tmp_path, capsys):
    folder = save_hf_checkpoint(peaked_tiny_model(), str(tmp_path / "tiny"), tokenizer=tiny_chat_tokenizer())
    assert main(["serve", folder, "--max-model-len", "100000"]) == 2
    assert "--max-model-len 100000 must lie in [2, " in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", folder, "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
