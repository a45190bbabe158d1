"""Loading a tokenizer folder: the generic fast class is loaded without AutoTokenizer's lookup (no PyTorch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tempax.models.tokenizer import _generic_fast_class, load_tokenizer
from tests.kit.tokenizers import tiny_chat_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = "Hello there, general reasoning 12 + 30 = 42"


def _saved(tmp_path) -> str:
    folder = str(tmp_path / "tok")
    tiny_chat_tokenizer().hf.save_pretrained(folder)
    return folder


def test_generic_folder_loads_the_named_class_with_the_same_ids_and_template(tmp_path):
    from transformers import AutoTokenizer

    folder = _saved(tmp_path)
    with open(os.path.join(folder, "tokenizer_config.json")) as f:
        assert json.load(f)["tokenizer_class"] in ("PreTrainedTokenizerFast", "TokenizersBackend")
    ours, auto = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    assert type(ours.hf) is type(auto)
    assert ours.encode(TEXT) == list(auto.encode(TEXT))
    messages = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(messages) == auto.apply_chat_template(messages, tokenize=False)
    assert ours.stop_ids and ours.pad_id == auto.pad_token_id


def test_generic_folder_does_not_import_torch(tmp_path):
    """A fresh process loads the folder and must not have imported torch (installed in the test environment)."""
    folder = _saved(tmp_path)
    code = (
        "import sys; from tempax.models.tokenizer import load_tokenizer; "
        f"t = load_tokenizer({folder!r}); print(len(t.encode('hi there')), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False"


def test_a_model_folder_or_a_specific_class_stays_with_autotokenizer(tmp_path):
    folder = _saved(tmp_path)
    assert _generic_fast_class(folder) is not None
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "llama"}, f)  # AutoTokenizer may map a model type to its own class
    assert _generic_fast_class(folder) is None
    os.remove(os.path.join(folder, "config.json"))
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path) as f:
        cfg = json.load(f)
    with open(path, "w") as f:
        json.dump({**cfg, "tokenizer_class": "GPT2Tokenizer"}, f)
    assert _generic_fast_class(folder) is None
    assert load_tokenizer(folder).encode(TEXT)  # AutoTokenizer still loads it
