"""The dequantised-weight cache of GGUF files (`tempax.models.weight_cache`): a second load reads the cache and
gives the same parameters; a changed file, a damaged entry, the size limit, an unwritable folder and the switch."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tempax.models import weight_cache
from tempax.models.gguf_io import load_gguf
from tests.models.test_gguf import _params, perturbed_model, write_gguf


@pytest.fixture
def gguf_file(tmp_path):
    return write_gguf(str(tmp_path / "tiny.Q8_0.gguf"), perturbed_model("llama"), qtype="Q8_0")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "weights"
    monkeypatch.setenv(weight_cache.WEIGHTS_DIR_ENV, str(folder))
    return folder


def _entries(folder) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def _same(a, b) -> None:
    pa, pb = _params(a), _params(b)
    assert pa.keys() == pb.keys()
    for name in pa:
        np.testing.assert_array_equal(pa[name], pb[name], err_msg=name)


def test_a_second_load_reads_the_cache_and_gives_the_same_weights(gguf_file, cache, monkeypatch):
    first = load_gguf(gguf_file)
    assert len(_entries(cache)) == 1
    # The second load must not read the file at all: the config and every tensor come from the cache.
    import tempax.models.gguf_io as gguf_io

    def no_dequantising(*args, **kwargs):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(gguf_io, "iter_gguf_tensors", no_dequantising)
    monkeypatch.setattr(gguf_io, "read_gguf_header", no_dequantising)  # the config comes from the entry too
    second = load_gguf(gguf_file)
    _same(first, second)
    monkeypatch.undo()  # the reader back, the cache off: the uncached path agrees
    _same(load_gguf(gguf_file), second)


def test_bfloat16_parameters_have_their_own_entry(gguf_file, cache):
    f32 = load_gguf(gguf_file)
    bf16 = load_gguf(gguf_file, param_dtype="bfloat16")
    assert len(_entries(cache)) == 1  # same file: the newer entry replaces the older
    again = load_gguf(gguf_file, param_dtype="bfloat16")
    _same(bf16, again)
    assert str(next(iter(_params(again).values())).dtype) == "bfloat16"
    assert str(next(iter(_params(f32).values())).dtype) == "float32"


def test_a_changed_file_gets_a_new_entry_and_the_old_one_goes(tmp_path, cache, monkeypatch):
    path = str(tmp_path / "m.gguf")
    write_gguf(path, perturbed_model("llama", seed=0), qtype="Q8_0")
    load_gguf(path)
    (old,) = _entries(cache)
    write_gguf(path, perturbed_model("llama", seed=1), qtype="Q8_0")
    os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 10**9))  # a rewrite within the same clock tick
    model = load_gguf(path)
    (new,) = _entries(cache)
    assert new != old
    monkeypatch.delenv(weight_cache.WEIGHTS_DIR_ENV)
    _same(model, load_gguf(path))


def test_a_damaged_entry_is_removed_and_the_file_read_again(gguf_file, cache):
    first = load_gguf(gguf_file)
    (entry,) = _entries(cache)
    with open(cache / entry / "params.bin", "r+b") as f:
        f.truncate(100)
    with pytest.warns(UserWarning, match="unusable"):
        second = load_gguf(gguf_file)
    _same(first, second)
    assert _entries(cache) == [entry]  # written again, whole
    _same(first, load_gguf(gguf_file))


def test_models_over_the_limit_are_not_cached(gguf_file, cache, monkeypatch):
    monkeypatch.setenv(weight_cache.MAX_GIB_ENV, "0.000001")
    load_gguf(gguf_file)
    assert _entries(cache) == []


def test_an_unwritable_folder_costs_only_the_cache(gguf_file, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(weight_cache.WEIGHTS_DIR_ENV, str(blocker / "weights"))
    with pytest.warns(UserWarning, match="could not cache the dequantised weights"):
        model = load_gguf(gguf_file)
    monkeypatch.delenv(weight_cache.WEIGHTS_DIR_ENV)
    _same(model, load_gguf(gguf_file))


def test_off_unless_the_folder_is_named(gguf_file, tmp_path, monkeypatch):
    monkeypatch.delenv(weight_cache.WEIGHTS_DIR_ENV, raising=False)
    assert weight_cache.cache_dir() is None
    load_gguf(gguf_file)
    assert not any(p.name == "weights" for p in tmp_path.iterdir())
