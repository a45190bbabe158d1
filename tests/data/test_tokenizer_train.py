"""Tokenizer training (byte-level BPE, round trip, saved folder loads) and extending a model's vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from tempax.data.tokenizer_train import (
    CHATML_TEMPLATE,
    corpus_texts,
    extend_model,
    roundtrip_exact,
    save_tokenizer,
    tokens_per_char,
    train_bpe,
)
from tempax.errors import ConfigError
from tempax.models.tokenizer import load_tokenizer
from tempax.models.vocab import mean_init_rows

CORPUS = ["Natalia sold 48 clips in April and half as many in May.", "How many clips did Natalia sell?",
          "She sold 48 / 2 = 24 clips in May, so 48 + 24 = 72 in all."] * 20
HELD_OUT = ["Weng earns $12 an hour for babysitting.", "Ünïcödé, 中文, emoji 🎉 and\ttabs\n\nkeep  spaces ",
            "<|im_start|> looks special but is text here"]


def test_train_roundtrip_and_reload(tmp_path):
    tok = train_bpe(CORPUS, 300)
    assert tok.vocab_size == 300
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert roundtrip_exact(tok, HELD_OUT[:2]) == (2, 2)  # byte-level: any string decodes back exactly
    folder = save_tokenizer(tok, str(tmp_path / "tok"))
    again = load_tokenizer(folder)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(folder)
    for text in HELD_OUT + CORPUS[:3]:
        ids = tok.encode(text, add_special_tokens=False)
        assert again.encode(text, add_special_tokens=False) == ids == hf.encode(text, add_special_tokens=False)
    assert again.hf.chat_template == CHATML_TEMPLATE and again.stop_ids[0] == 2
    rendered = again.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_compression_is_tokens_over_characters():
    """A 300-token vocabulary fitted to the corpus compresses the corpus better than bytes alone (< 1 token per
    character), and tokens_per_char is exactly len(ids) / len(text)."""
    tok = train_bpe(CORPUS, 300)
    text = CORPUS[0]
    assert tokens_per_char(tok, [text]) == len(tok.encode(text, add_special_tokens=False)) / len(text)
    assert tokens_per_char(tok, CORPUS[:3]) < 0.5


def test_bad_vocab_size():
    with pytest.raises(ConfigError, match="byte symbols"):
        train_bpe(CORPUS, 100)


def test_corpus_texts_reads_rows_and_txt(tmp_path):
    (tmp_path / "a.txt").write_text("first para\n\nsecond para\n")
    (tmp_path / "b.jsonl").write_text('{"question": "q?", "answer": "a."}\n')
    assert list(corpus_texts([str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")])) == [
        "first para", "second para\n", "q?", "a."]


def test_mean_init_rows():
    """[[1, 2], [3, 4]] plus one row -> the new row is the column mean [2, 3]."""
    out = mean_init_rows(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), 1)
    assert out.tolist() == [[1.0, 2.0], [3.0, 4.0], [2.0, 3.0]]


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    """A tiny model (untied head, so both tables grow) + tokenizer saved as a checkpoint, then extended."""
    from tempax.models.hf_io import save_hf_checkpoint
    from tests.kit.models import tiny_tempax_model

    tmp = tmp_path_factory.mktemp("extend")
    model = tiny_tempax_model("llama", vocab_size=300)
    base = save_hf_checkpoint(model, str(tmp / "base"), tokenizer=train_bpe(CORPUS, 300))
    return model, extend_model(base, ["<calc>", "</calc>", "<calc>"], str(tmp / "ext")), tmp


@pytest.mark.heavy
def test_extend_model_end_to_end(extended):
    """The two new tokens get ids 300 and 301 (a repeated token is added once); the saved folder reloads with
    those ids; the new embedding and LM-head rows are the mean rows and the old rows and old logits are
    unchanged."""
    import jax.numpy as jnp

    from tempax.models.registry import load

    model, ext, tmp = extended
    assert ext.added == {"<calc>": 300, "</calc>": 301} and (ext.old_vocab, ext.new_vocab) == (300, 302)
    new_model, new_tok = load(ext.folder, progress=False)
    assert new_model.config.vocab_size == 302
    ids = new_tok.encode("<calc>48/2</calc> = 24", add_special_tokens=False)
    assert ids[0] == 300 and 301 in ids
    emb, old = np.asarray(new_model.embed_tokens.embedding[...]), np.asarray(model.embed_tokens.embedding[...])
    np.testing.assert_allclose(emb[300:], np.stack([old.mean(0)] * 2), atol=1e-6)
    np.testing.assert_array_equal(emb[:300], old)
    head, old_head = np.asarray(new_model.lm_head.kernel[...]), np.asarray(model.lm_head.kernel[...])
    np.testing.assert_allclose(head[:, 300], old_head.mean(1), atol=1e-6)
    tokens = jnp.asarray([[5, 6, 7]], jnp.int32)
    np.testing.assert_allclose(np.asarray(new_model(tokens)[0][..., :300]), np.asarray(model(tokens)[0]), atol=1e-5)
    with pytest.raises(ConfigError, match="already in the tokenizer"):
        extend_model(ext.folder, ["<calc>"], str(tmp / "again"))


@pytest.mark.heavy
def test_continued_pretraining_with_new_tokens(extended, tmp_path):
    """`tempax pretrain` on the extended checkpoint: text using the new tokens trains (the loss falls over 8
    full fine-tuning steps of the 2-layer model)."""
    import json

    from tempax.algorithms.sft.main import PretrainConfig, main
    from tempax.configlib import from_dict

    _, ext, _ = extended
    data = tmp_path / "calc.jsonl"
    with open(data, "w") as f:
        for i in range(8):
            f.write(json.dumps({"text": f"She sold <calc>{i}*2={2 * i}</calc> clips."}) + "\n")
    cfg = from_dict(PretrainConfig, {
        "model": {"source": ext.folder},
        "data": {"path": str(data), "text_fields": [], "packing": False},
        "train": {"steps": 8, "batch_size": 4, "seq_len": 32, "progress_bar": False, "tensorboard": False,
                  "run_dir": str(tmp_path / "run"), "mesh": {"num_devices": 1},
                  "optimizer": {"learning_rate": 1e-2, "schedule": "constant", "weight_decay": 0.0},
                  "checkpoint": {"save_at_end": False}},
    })
    result = main(cfg, log=lambda _: None)
    assert result.losses[-1] < result.losses[0], result.losses
