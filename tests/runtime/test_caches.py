"""tempax.runtime.caches: one cache folder for everything one run hands to the next."""

from __future__ import annotations

import os

from tempax.runtime.caches import cache_root, jax_cache_in_use


def test_cache_root_follows_tempax_cache_or_defaults_under_home(monkeypatch, tmp_path):
    monkeypatch.setenv("TEMPAX_CACHE", str(tmp_path / "c"))
    assert cache_root() == str(tmp_path / "c")
    monkeypatch.delenv("TEMPAX_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == os.path.join(str(tmp_path / "home"), ".cache", "tempax")
    monkeypatch.setenv("TEMPAX_CACHE", "")  # set but empty: the default, not the working directory
    assert cache_root() == os.path.join(str(tmp_path / "home"), ".cache", "tempax")


def test_jax_cache_in_use_reads_jax_and_the_environment(monkeypatch, tmp_path):
    import jax

    before = jax.config.jax_compilation_cache_dir
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert not jax_cache_in_use()
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
        assert jax_cache_in_use()
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        assert jax_cache_in_use()
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
