"""`tempax.export.exporter`: OUT is never SOURCE, and is written whole or not at all (the command's refusals of an
existing OUT: tests/cli/test_export_overwrite.py)."""

from __future__ import annotations

import os

import pytest

from tempax.errors import ConfigError
from tempax.export.exporter import check_destination, export

SOURCE = "preset:tiny-llama"  # a model source that needs no files


def _tree(folder) -> dict[str, bytes]:
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = f.read()
    return out


def test_out_may_never_be_the_source_or_hold_it(tmp_path):
    hf = tmp_path / "hf"
    export(SOURCE, str(hf))
    with pytest.raises(ConfigError, match="is SOURCE .* or holds it"):
        check_destination(str(hf), str(hf), gguf=False, overwrite=True)
    with pytest.raises(ConfigError, match="is SOURCE .* or holds it"):
        check_destination(str(hf), str(tmp_path), gguf=False, overwrite=True)


@pytest.mark.heavy
def test_a_failed_export_leaves_the_old_out_as_it_was(tmp_path, monkeypatch):
    """The weights are written, then the card fails: OUT keeps the earlier export, byte for byte."""
    import tempax.export.model_card as model_card

    hf = tmp_path / "hf"
    export(SOURCE, str(hf))
    before = _tree(hf)

    def broken_readme(card):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model_card, "readme", broken_readme)
    with pytest.raises(OSError, match="No space left"):
        export(SOURCE, str(hf), overwrite=True)
    assert _tree(hf) == before
    assert os.listdir(tmp_path) == ["hf"]
