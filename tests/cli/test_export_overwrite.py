"""`tempax export` never replaces what the user has unasked: an existing OUT is refused (exit 2, naming the path
and --overwrite), and --overwrite replaces only a file or a folder an export wrote, whole."""

from __future__ import annotations

import os

import pytest

from tempax.cli.main import main
from tests.export.test_exporter import SOURCE, _tree


def _error(capfd) -> str:
    err = capfd.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


def test_an_existing_file_is_refused_with_or_without_gguf_and_kept(tmp_path, capfd):
    """The report: `export RUN existing.txt --gguf --quant q4_0` replaced the file; without --gguf it ended in a
    FileExistsError traceback. Both are now one line naming the path and --overwrite, and the file is intact."""
    mine = tmp_path / "existing.txt"
    mine.write_text("my notes\n")
    assert main(["export", SOURCE, str(mine), "--gguf", "--quant", "f32"]) == 2
    err = _error(capfd)
    assert f"OUT {mine} exists; the export writes one GGUF file there" in err and "--overwrite" in err
    assert main(["export", SOURCE, str(mine)]) == 2
    err = _error(capfd)
    assert f"OUT {mine} exists; the export writes a Hugging Face folder" in err and "--overwrite" in err
    assert mine.read_text() == "my notes\n"
    assert sorted(os.listdir(tmp_path)) == ["existing.txt"]  # nothing staged beside it


def test_a_folder_that_is_not_empty_is_refused_even_with_overwrite_unless_an_export_wrote_it(tmp_path, capfd):
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["export", SOURCE, str(mine)]) == 2
    assert f"OUT {mine} is a folder that is not empty (notes.txt); exporting into it would mix" in _error(capfd)
    assert main(["export", SOURCE, str(mine), "--overwrite"]) == 2
    assert "holds more than an exported model (notes.txt); --overwrite replaces only a folder an export wrote" in (
        _error(capfd))
    assert main(["export", SOURCE, str(tmp_path / "m.gguf"), "--quant", "f32"]) == 0
    capfd.readouterr()
    assert main(["export", str(tmp_path / "m.gguf"), str(mine), "--gguf", "--overwrite"]) == 2
    assert f"OUT {mine} is a folder, and a GGUF export is one file; name a file in it" in _error(capfd)
    assert _tree(mine) == {"notes.txt": b"keep me"}


@pytest.mark.heavy
def test_overwrite_replaces_a_file_and_an_earlier_export_whole(tmp_path, capfd):
    """With --overwrite the new OUT takes the old one's place whole: no file of the earlier export is left over
    (a shard the new one does not write), and an empty folder or a new path need no flag."""
    gguf = tmp_path / "model.gguf"
    gguf.write_text("an old file")
    assert main(["export", SOURCE, str(gguf), "--quant", "f32", "--overwrite"]) == 0
    assert gguf.read_bytes()[:4] == b"GGUF"
    hf = tmp_path / "hf"
    assert main(["export", SOURCE, str(hf)]) == 0
    (hf / "model-00002-of-00002.safetensors").write_bytes(b"a shard of an earlier, larger export")
    assert main(["export", SOURCE, str(hf), "--overwrite", "--dtype", "bfloat16"]) == 0
    assert "model-00002-of-00002.safetensors" not in os.listdir(hf) and "config.json" in os.listdir(hf)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", SOURCE, str(empty)]) == 0 and "config.json" in os.listdir(empty)
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".")) == []  # no staging folder left
    capfd.readouterr()
