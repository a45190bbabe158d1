"""bench/tpu_attention.py: on a CPU it says it needs a TPU, and --tiny runs every implementation in interpret
mode and reports each one's figures."""

import json

import jax
import pytest

from bench import tpu_attention


def _records(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


@pytest.mark.skipif(jax.default_backend() == "tpu", reason="the CPU branch of the script")
def test_without_a_tpu_it_says_so(capsys):
    assert tpu_attention.main([]) == 0
    (record,) = _records(capsys)
    assert "need a TPU" in record["skipped"] and record["jax"] == jax.__version__


@pytest.mark.heavy
def test_tiny_run_reports_every_implementation(capsys):
    """Training: plain, xla, splash and splash_heads_first, forward and forward_backward; decode: plain and paged.
    None fails, each has a time, and every record names the device and the JAX version."""
    assert tpu_attention.main(["--tiny"]) == 0
    records = _records(capsys)
    assert not [r for r in records if "error" in r]
    training = [(r["impl"], r["pass"]) for r in records if r["part"] == "training"]
    assert training == [(impl, p) for impl in ("plain", "xla", "splash", "splash_heads_first")
                        for p in ("forward", "forward_backward")]
    assert [r["impl"] for r in records if r["part"] == "decode"] == ["plain", "paged"]
    assert all(r.get("ms", r.get("us", 0)) > 0 and r["device"] and r["jax"] == jax.__version__ for r in records)
