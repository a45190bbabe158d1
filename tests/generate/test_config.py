"""tempax.generate.config: a request's sampling knobs, normalised and checked once, each bad value named."""

from __future__ import annotations

import pytest

from tempax.errors import GenerationError
from tempax.generate.config import SamplingConfig


def test_lists_become_tuples_and_one_stop_string_a_tuple():
    """YAML and JSON callers pass lists; the config stays hashable (a jit static argument)."""
    cfg = SamplingConfig(stop="###", stop_token_ids=[2, 7])
    assert cfg.stop == ("###",) and cfg.stop_token_ids == (2, 7)
    assert SamplingConfig(stop=["a", "b"]).stop == ("a", "b")
    hash(cfg)


@pytest.mark.parametrize(("change", "message"), [
    ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer, got 0"),
    ({"temperature": -0.1}, "temperature must be >= 0"),
    ({"temperature": float("nan")}, "temperature must be >= 0"),
    ({"top_k": -1}, "top_k must be an integer >= 0"),
    ({"top_p": 0.0}, r"top_p must lie in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must lie in \(0, 1\]"),
    ({"min_p": 2.0}, r"min_p must lie in \[0, 1\]"),
    ({"n": 0}, "n \\(samples per prompt\\) must be an integer >= 1"),
    ({"seed": 2**32}, r"seed must be an integer in \[0, 2\*\*32\)"),
    ({"stop": ("",)}, "stop strings must be non-empty strings"),
    ({"decode_layout": "yes"}, "decode_layout must be 'auto', 'on' or 'off'"),
    ({"max_len": 1}, "max_len must be at least 2"),
])
def test_each_bad_knob_is_named(change, message):
    with pytest.raises(GenerationError, match=message):
        SamplingConfig(**change)


def test_greedy_is_temperature_zero_and_replace_checks_again():
    assert SamplingConfig(temperature=0.0).greedy and not SamplingConfig().greedy
    cfg = SamplingConfig().replace(n=4, temperature=0.5)
    assert (cfg.n, cfg.temperature, cfg.max_new_tokens) == (4, 0.5, 256)
    with pytest.raises(GenerationError, match="n \\(samples per prompt\\)"):
        SamplingConfig().replace(n=0)
