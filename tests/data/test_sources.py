"""Reading rows from files, folders, saved `datasets` and (mocked) Hub ids, with provenance."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from tempax.data.sources import Row, as_rows, holdout_split, read_rows
from tempax.errors import ConfigError, DataError

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
SFT_FILE = os.path.join(SHARED, "hh-rlhf-sft", "train.jsonl")
HH_DIR = os.path.join(SHARED, "hh-rlhf")


def _write(path, text: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


def test_jsonl_keeps_line_numbers_and_flags_bad_lines(tmp_path):
    """Blank lines are not rows but still count for numbering; bad JSON and non-objects become error rows."""
    path = _write(tmp_path / "d.jsonl", '{"a": 1}\n\n{"a": 2}\nnot json\n[1, 2]\n')
    rows = read_rows(path)
    assert [(r.index, r.data) for r in rows[:2]] == [(1, {"a": 1}), (3, {"a": 2})]
    assert rows[2].index == 4 and rows[2].data is None and rows[2].error.startswith("invalid JSON")
    assert rows[3].index == 5 and rows[3].error == "not an object: list"
    assert rows[1].where == f"{path}:3"


def test_jsonl_gz_and_json_list_and_json_holding_lines(tmp_path):
    gz = tmp_path / "d.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write('{"x": "é"}\n{"x": "b"}\n')
    assert [r.data["x"] for r in read_rows(gz)] == ["é", "b"]

    as_list = _write(tmp_path / "l.json", json.dumps([{"x": 1}, {"x": 2}, 3]))
    rows = read_rows(as_list)
    assert [r.index for r in rows] == [1, 2, 3] and rows[2].data is None

    # Plenty of datasets ship JSON Lines under a .json name.
    lines = _write(tmp_path / "lines.json", '{"x": 1}\n{"x": 2}\n')
    assert [r.data["x"] for r in read_rows(lines)] == [1, 2]

    with pytest.raises(DataError, match="expected a JSON list"):
        read_rows(_write(tmp_path / "obj.json", '{"x": 1}'))


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "a"}, {"text": "b"}]), path)
    rows = read_rows(path)
    assert [(r.index, r.data) for r in rows] == [(1, {"text": "a"}), (2, {"text": "b"})]


def test_saved_dataset_folder_with_and_without_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    single = tmp_path / "single"
    datasets.Dataset.from_list([{"text": "a"}, {"text": "b"}]).save_to_disk(str(single))
    assert [r.data["text"] for r in read_rows(single)] == ["a", "b"]

    multi = tmp_path / "multi"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"text": "t"}]),
            "test": datasets.Dataset.from_list([{"text": "e1"}, {"text": "e2"}]),
        }
    ).save_to_disk(str(multi))
    rows = read_rows(multi, split="test")
    assert [r.data["text"] for r in rows] == ["e1", "e2"]
    assert rows[1].where == f"{multi}[test]:2"
    with pytest.raises(DataError, match="split 'dev' not found"):
        read_rows(multi, split="dev")


def test_folder_of_split_files(tmp_path):
    _write(tmp_path / "train.jsonl", '{"a": 1}\n')
    _write(tmp_path / "test.jsonl", '{"a": 2}\n{"a": 3}\n')
    assert len(read_rows(tmp_path, split="test")) == 2
    with pytest.raises(DataError, match=r"pass data.split=\.\.\. \(--split on the command line\)"):
        read_rows(tmp_path)
    with pytest.raises(DataError, match="split 'dev'"):
        read_rows(tmp_path, split="dev")


def test_missing_local_path_names_it_and_never_touches_the_hub(tmp_path, monkeypatch):
    import datasets

    def no_hub(*args, **kwargs):
        raise AssertionError("a local-looking path must not reach the Hub")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    for missing in (str(tmp_path / "nope.jsonl"), "data/nope.jsonl", "./nope", "nope.parquet"):
        with pytest.raises(DataError, match="not found") as e:
            read_rows(missing)
        assert missing in str(e.value)


def test_no_path_is_a_config_error_naming_the_key(monkeypatch):
    """A recipe that names no data (tempax ships no default data set) stops before any file or the Hub is read."""
    import datasets

    def no_hub(*args, **kwargs):
        raise AssertionError("no path must not reach the Hub")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    with pytest.raises(ConfigError) as e:
        read_rows(None)
    assert str(e.value) == ("data.path is required: the training rows, as a .jsonl/.json/.parquet file (gzip ok), a "
                            "folder or a Hugging Face Hub dataset id; set it in the recipe (data: {path: ...}) or on "
                            "the command line (data.path=...)")


def test_unreachable_hub_id_is_a_data_error(monkeypatch):
    import datasets

    def offline(name, split=None):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match="neither a local path nor a reachable Hugging Face Hub dataset id"):
        read_rows("someone/some-dataset")


def test_hub_rows_are_read_through_load_dataset(monkeypatch):
    import datasets

    seen = {}

    def fake(name, split=None):
        seen.update(name=name, split=split)
        return datasets.Dataset.from_list([{"text": "hub"}])

    monkeypatch.setattr(datasets, "load_dataset", fake)
    rows = read_rows("someone/some-dataset", split="validation")
    assert seen == {"name": "someone/some-dataset", "split": "validation"}
    assert rows[0].where == "hf://someone/some-dataset[validation]:1" and rows[0].data == {"text": "hub"}


def test_split_on_a_single_file_is_refused(tmp_path):
    with pytest.raises(DataError, match="single file"):
        read_rows(_write(tmp_path / "d.jsonl", '{"a": 1}\n'), split="train")


def test_holdout_split_is_seeded_disjoint_and_order_preserving():
    """20 rows, fraction 0.25 -> round(5.0) = 5 held out, 15 kept; both parts in source order."""
    rows = as_rows([{"i": i} for i in range(20)])
    train, held = holdout_split(rows, 0.25, seed=3)
    assert (len(train), len(held)) == (15, 5)
    assert sorted(r.data["i"] for r in train + held) == list(range(20))
    assert [r.index for r in held] == sorted(r.index for r in held)
    assert holdout_split(rows, 0.25, seed=3) == (train, held)
    assert holdout_split(rows, 0.25, seed=4)[1] != held
    with pytest.raises(ConfigError):
        holdout_split(rows, 1.0)


def test_as_rows_wraps_dicts_and_passes_rows_through():
    row = Row(data={"a": 1}, source="f.jsonl", index=7)
    wrapped = as_rows([{"b": 2}, row, "oops"])
    assert wrapped[0].where == "<memory>:1" and wrapped[1] is row and wrapped[2].error == "not an object: str"


def test_real_shared_files():
    """hh-rlhf-sft has 3881 rows; hh-rlhf has 1807 train and 500 test pairs (from their READMEs)."""
    sft = read_rows(SFT_FILE)
    assert len(sft) == 3881 and all(r.error is None for r in sft)
    assert sft[0].index == 1 and sft[-1].index == 3881 and "messages" in sft[0].data
    assert len(read_rows(HH_DIR, split="train")) == 1807
    test = read_rows(os.path.join(HH_DIR, "test.jsonl.gz"))
    assert len(test) == 500 and set(test[0].data) == {"chosen", "rejected"}


def test_a_line_that_is_not_utf8_is_one_bad_row_named_by_line(tmp_path):
    """Line 2 holds the Latin-1 byte 0xe9 ("é" in Latin-1): that line alone is a bad row, `invalid_utf8` at
    file:2, and the lines around it are read, gzipped or not, streamed or whole."""
    raw = b'{"text": "one"}\n{"text": "caf\xe9"}\n{"text": "three"}\n'
    plain, gz = tmp_path / "d.jsonl", tmp_path / "d.jsonl.gz"
    plain.write_bytes(raw)
    gz.write_bytes(gzip.compress(raw))
    from tempax.data.sources import iter_rows

    for rows in (read_rows(plain), list(iter_rows(plain)), read_rows(gz), list(iter_rows(gz))):
        assert [r.data for r in rows] == [{"text": "one"}, None, {"text": "three"}]
        bad = rows[1]
        assert (bad.index, bad.reason) == (2, "invalid_utf8")
        assert bad.error == "invalid UTF-8: invalid continuation byte at byte 0xe9, column 14"
    assert read_rows(tmp_path / "d.jsonl")[1].where == f"{plain}:2"


def test_a_json_list_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "d.json"
    path.write_bytes(b'[\n{"text": "a"},\n{"text": "\xff"}\n]\n')
    with pytest.raises(DataError, match=r"d\.json:3 is not UTF-8 \(invalid start byte at byte 0xff\)"):
        read_rows(path)
