"""The program store: a later process loads generation's executables without tracing, and gets the same tokens."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tempax.generate import SamplingConfig, engine, generate
from tempax.generate.program_store import PROGRAMS_DIR_ENV, ProgramStore, program_key

PROMPTS = [[5, 17, 42, 9], [3, 8]]
SAMPLED = SamplingConfig(n=2, temperature=0.9, top_k=20, max_new_tokens=10, seed=3, logprobs=True)


def _fresh_process(monkeypatch, folder) -> None:
    """What a new `tempax` process starts with: the store's folder set, nothing loaded yet."""
    monkeypatch.setenv(PROGRAMS_DIR_ENV, str(folder))
    monkeypatch.setattr(engine, "_STORED", {})


def _same(a, b) -> None:
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_array_equal(a.mask, b.mask)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)


def test_a_second_process_loads_both_programs_and_samples_the_same(model, tmp_path, monkeypatch):
    monkeypatch.delenv(PROGRAMS_DIR_ENV, raising=False)
    plain = generate(model, None, PROMPTS, SAMPLED)  # jit's own path, no store
    _fresh_process(monkeypatch, tmp_path)
    first = generate(model, None, PROMPTS, SAMPLED)
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".program")]) == 2  # prefill and decode
    _fresh_process(monkeypatch, tmp_path)
    second = generate(model, None, PROMPTS, SAMPLED)
    assert second.stats.compiles == 0  # nothing traced: both executables came from the files
    _same(first, plain)
    _same(second, plain)


def test_stop_strings_and_chunked_decoding_run_on_stored_programs(model, tokenizer, tmp_path, monkeypatch):
    """Chunked decode calls (stop checks every few tokens) and rows marked done on the host go through the stored
    decode program as they go through jit's."""
    config = SamplingConfig(max_new_tokens=24, temperature=0.0, stop=("zz",))
    monkeypatch.delenv(PROGRAMS_DIR_ENV, raising=False)
    plain = generate(model, tokenizer, ["hello there"], config)
    _fresh_process(monkeypatch, tmp_path)
    generate(model, tokenizer, ["hello there"], config)
    _fresh_process(monkeypatch, tmp_path)
    stored = generate(model, tokenizer, ["hello there"], config)
    assert stored.stats.compiles == 0
    assert stored.texts == plain.texts
    _same(stored, plain)


@pytest.mark.heavy
def test_a_second_chat_loads_every_turns_programs_and_says_the_same(model, tokenizer, tmp_path, monkeypatch):
    """`tempax chat` runs on the store: each turn re-renders the whole conversation, so a later turn can fall in a
    longer prompt bucket; the first session stores each bucket's pair, a second one traces nothing."""
    import io

    from tempax.generate.chat import chat_loop

    turns = "hello there\n" + "tell me more about that, and then some more words to pass a bucket\n" * 3
    config = SamplingConfig(max_new_tokens=12, temperature=0.0)

    def session() -> tuple[str, int]:
        out = io.StringIO()
        before = sum(engine._TRACES.values())
        chat_loop(model, tokenizer, config, system=None, chunk=4, inp=io.StringIO(turns), out=out)
        return out.getvalue(), sum(engine._TRACES.values()) - before

    monkeypatch.delenv(PROGRAMS_DIR_ENV, raising=False)
    plain, _ = session()
    _fresh_process(monkeypatch, tmp_path)
    first, _ = session()
    stored = [f for f in os.listdir(tmp_path) if f.endswith(".program")]
    assert len(stored) >= 4 and len(stored) % 2 == 0  # a prefill and a decode per prompt bucket, two buckets at least
    _fresh_process(monkeypatch, tmp_path)
    second, traced = session()
    assert traced == 0
    assert first == plain and second == plain


def test_a_damaged_program_file_is_a_miss_and_is_replaced(model, tmp_path, monkeypatch):
    _fresh_process(monkeypatch, tmp_path)
    first = generate(model, None, PROMPTS, SAMPLED)
    for name in os.listdir(tmp_path):
        with open(tmp_path / name, "wb") as f:
            f.write(b"not a program")
    _fresh_process(monkeypatch, tmp_path)
    again = generate(model, None, PROMPTS, SAMPLED)
    _same(again, first)
    for name in os.listdir(tmp_path):
        assert (tmp_path / name).read_bytes() != b"not a program"  # compiled again and written whole
    _fresh_process(monkeypatch, tmp_path)
    assert generate(model, None, PROMPTS, SAMPLED).stats.compiles == 0  # the rewritten files load


def test_an_unwritable_folder_costs_nothing_but_the_store(model, tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.delenv(PROGRAMS_DIR_ENV, raising=False)
    plain = generate(model, None, PROMPTS, SAMPLED)
    _fresh_process(monkeypatch, blocked / "programs")  # a folder inside a file cannot be made
    _same(generate(model, None, PROMPTS, SAMPLED), plain)


def test_the_key_follows_shapes_static_arguments_and_flags(monkeypatch):
    x = np.zeros((2, 16), np.int32)
    base = program_key("prefill", {"n": 1}, (x,))
    assert program_key("prefill", {"n": 1}, (np.zeros((2, 16), np.int32),)) == base  # same in every call
    assert program_key("prefill", {"n": 2}, (x,)) != base
    assert program_key("prefill", {"n": 1}, (np.zeros((2, 32), np.int32),)) != base
    assert program_key("prefill", {"n": 1}, (x.astype(np.int64),)) != base
    assert program_key("decode", {"n": 1}, (x,)) != base
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_onednn=true")
    assert program_key("prefill", {"n": 1}, (x,)) != base


def test_the_key_ignores_function_addresses():
    """A static argument that holds a function (a graph definition does) keys by its name, not its address,
    which differs in every process."""

    def one():
        return 1

    def two():
        return 1

    two.__name__ = two.__qualname__ = one.__qualname__
    assert program_key("p", {"f": one}, ()) == program_key("p", {"f": two}, ())


def test_a_missing_program_loads_as_none(tmp_path):
    assert ProgramStore(str(tmp_path)).load("0" * 64) is None


def test_only_arguments_on_the_default_device_are_served():
    """The store loads a program onto the default device; an argument committed to another device (the tests'
    host has 8) is left to jit."""
    import jax

    from tempax.generate.program_store import single_device

    assert single_device((np.zeros(3), jax.numpy.zeros(3)))
    assert single_device((jax.device_put(np.zeros(3), jax.devices()[0]),))
    if len(jax.devices()) > 1:
        assert not single_device((jax.device_put(np.zeros(3), jax.devices()[1]),))


def test_no_store_beside_jax_persistent_cache(tmp_path, monkeypatch):
    """A program compiled where JAX has loaded executables from its persistent cache can serialise incompletely,
    so a process with that cache on stores nothing."""
    from tempax.generate.program_store import default_store

    monkeypatch.setenv(PROGRAMS_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert default_store() is not None
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert default_store() is None
