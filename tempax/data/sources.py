"""Reading dataset rows from local files, `datasets` folders and the Hugging Face Hub.

Every row keeps where it came from (file and 1-based line or item number) so a malformed row can be named in an
error message. Reading never interprets the row: turning rows into tokens is `formats.py` / `preference.py`.
JSON Lines are decoded line by line, so one line that is not UTF-8 is one bad row (`invalid_utf8`, file:line),
counted against `data.max_bad_fraction` like a line of bad JSON, rather than a refusal of the whole file.

Supported sources, tried in this order:
  * a local file: `.jsonl` (one object per line), `.json` (a list of objects; JSON Lines is accepted too),
    `.parquet`, each optionally gzip-compressed (`.jsonl.gz`, `.json.gz`);
  * a local folder written by `datasets.Dataset.save_to_disk` / `DatasetDict.save_to_disk`;
  * a local folder holding `<split>.jsonl[.gz]`, `<split>.json[.gz]` or `<split>.parquet`;
  * otherwise a Hub dataset id, read with `datasets.load_dataset(path, split=split)`.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from tempax.errors import ConfigError, DataError

_EXTENSIONS = (".jsonl", ".json", ".parquet")
# tempax ships no default data set: a recipe names its rows, and a run without them stops before reading anything.
DATA_PATH_REQUIRED = ("data.path is required: the training rows, as a .jsonl/.json/.parquet file (gzip ok), a folder "
                      "or a Hugging Face Hub dataset id; set it in the recipe (data: {path: ...}) or on the command "
                      "line (data.path=...)")


@dataclass(frozen=True)
class Row:
    """One dataset row and where it came from.

    Attributes:
      data: the parsed object, or None when the line could not be parsed (see `error`).
      source: the file, folder or Hub id the row was read from.
      index: 1-based line number for JSON Lines, 1-based item/row number otherwise.
      error: why the row could not be parsed (not UTF-8, bad JSON, not an object); None for a good row.
    """

    data: dict[str, Any] | None
    source: str
    index: int
    error: str | None = None

    @property
    def where(self) -> str:
        return f"{self.source}:{self.index}"

    @property
    def reason(self) -> str:
        """The data report's name for why the row could not be parsed: invalid_utf8, invalid_json, not_an_object."""
        for prefix, reason in _ERROR_REASONS:
            if (self.error or "").startswith(prefix):
                return reason
        return "not_an_object"


_ERROR_REASONS = (("invalid UTF-8", "invalid_utf8"), ("invalid JSON", "invalid_json"))


def as_rows(items: Iterable[dict[str, Any] | Row], *, source: str = "<memory>") -> list[Row]:
    """Wraps in-memory dicts as rows (numbered from 1); `Row`s pass through unchanged."""
    out: list[Row] = []
    for i, item in enumerate(items, start=1):
        if isinstance(item, Row):
            out.append(item)
        elif isinstance(item, dict):
            out.append(Row(data=item, source=source, index=i))
        else:
            out.append(Row(data=None, source=source, index=i, error=f"not an object: {type(item).__name__}"))
    return out


def read_rows(path: str | os.PathLike | None, *, split: str | None = None) -> list[Row]:
    """Reads every row of a dataset.

    Args:
      path: a local file or folder (see the module docstring) or a Hugging Face Hub dataset id; None (a recipe's
        unset `data.path`) is a `ConfigError` naming the key.
      split: the split to read from a folder or Hub dataset ("train", "test", ...). Must be None for a file.

    Raises:
      ConfigError: no path (`DATA_PATH_REQUIRED`).
      DataError: the path is neither a readable local dataset nor a reachable Hub dataset, or the split is
        missing.
    """
    if path is None:
        raise ConfigError(DATA_PATH_REQUIRED)
    path = os.fspath(path)
    expanded = os.path.expanduser(path)
    if os.path.isfile(expanded):
        if split is not None:
            raise DataError(
                f"{path} is a single file, so split={split!r} cannot apply; pass the file of that split, or use "
                "a held-out fraction (holdout_split) to carve an evaluation set from it."
            )
        return _read_file(expanded)
    if os.path.isdir(expanded):
        return _read_folder(expanded, split)
    if _looks_local(path):
        raise DataError(
            f"dataset file not found: {path} (no such local file or folder, and it is not a Hub dataset id). "
            "Check the path; relative paths are resolved from the current directory "
            f"{os.getcwd()}."
        )
    return _read_hub(path, split)


def holdout_split(rows: Sequence[Row], fraction: float, *, seed: int = 0) -> tuple[list[Row], list[Row]]:
    """Splits rows into (train, held_out) with a seeded random choice of `round(fraction * n)` held-out rows.

    Both parts keep the original row order. The same (rows, fraction, seed) always gives the same split.
    """
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"holdout fraction must be in (0, 1), got {fraction}")
    n = len(rows)
    k = min(max(int(round(fraction * n)), 1), n - 1) if n > 1 else 0
    # PCG64 streams are stable across numpy versions, so the split is reproducible.
    held = set(np.random.default_rng(seed).permutation(n)[:k].tolist())
    train = [r for i, r in enumerate(rows) if i not in held]
    heldout = [r for i, r in enumerate(rows) if i in held]
    return train, heldout


def _looks_local(path: str) -> bool:
    """Hub ids are `name` or `owner/name`; anything path-like or with a data-file suffix is meant locally."""
    if path.startswith(("/", "./", "../", "~", ".")) or path.count("/") > 1:
        return True
    return _strip_gz(path)[0].endswith(_EXTENSIONS)


def _strip_gz(path: str) -> tuple[str, bool]:
    return (path[:-3], True) if path.endswith(".gz") else (path, False)


def _read_file(path: str) -> list[Row]:
    base, gz = _strip_gz(path)
    if base.endswith(".parquet"):
        if gz:
            raise DataError(f"{path}: gzip-compressed parquet is not supported; parquet compresses internally.")
        return _read_parquet(path)
    opener = gzip.open if gz else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read {path}: {e}") from e
    if base.endswith(".json"):
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            rows = _parse_jsonl(raw, path)
            if any(row.data is not None for row in rows):  # JSON Lines under a .json name: skip the bad lines
                return rows
            line = raw.count(b"\n", 0, e.start) + 1
            raise DataError(f"{path}:{line} is not UTF-8 ({e.reason} at byte 0x{raw[e.start]:02x}); re-export the "
                            "file as UTF-8 JSON.") from e
        except json.JSONDecodeError as e:
            if "Extra data" in str(e):
                # Many datasets ship JSON Lines under a .json name.
                return _parse_jsonl(raw, path)
            raise DataError(f"{path} is not valid JSON: {e}") from e
        if not isinstance(obj, list):
            raise DataError(f"{path}: expected a JSON list of objects, got a {type(obj).__name__}")
        return [
            Row(data=o, source=path, index=i)
            if isinstance(o, dict)
            else Row(data=None, source=path, index=i, error=f"not an object: {type(o).__name__}")
            for i, o in enumerate(obj, start=1)
        ]
    if base.endswith(".jsonl"):
        return _parse_jsonl(raw, path)
    raise DataError(
        f"{path}: unknown data file type; use .jsonl, .json or .parquet (optionally .gz for the JSON kinds)."
    )


def _parse_jsonl(raw: bytes, path: str) -> list[Row]:
    return list(_iter_jsonl(io.BytesIO(raw), path))


def _iter_jsonl(lines: Iterable[bytes], path: str) -> Iterator[Row]:
    """One row per line of raw bytes; a line that is not UTF-8 becomes a bad row instead of ending the file."""
    for lineno, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield Row(data=None, source=path, index=lineno,
                      error=f"invalid UTF-8: {e.reason} at byte 0x{raw[e.start]:02x}, column {e.start + 1}")
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield Row(data=None, source=path, index=lineno, error=f"invalid JSON: {e.msg}")
            continue
        if isinstance(obj, dict):
            yield Row(data=obj, source=path, index=lineno)
        else:
            yield Row(data=None, source=path, index=lineno, error=f"not an object: {type(obj).__name__}")


def iter_rows(path: str | os.PathLike, *, split: str | None = None) -> Iterator[Row]:
    """Rows one at a time, holding only the current one: JSON Lines files (optionally gzipped) are read line by
    line and parquet files batch by batch, so a file larger than memory streams. Other sources (a `.json` list,
    a saved dataset, the Hub) are read whole by `read_rows` and then yielded.

    Raises:
      DataError: as `read_rows`; also when the file cannot be read or decoded part-way through.
    """
    path = os.fspath(path)
    expanded = os.path.expanduser(path)
    if not os.path.isfile(expanded) or split is not None:
        yield from read_rows(path, split=split)
        return
    base, gz = _strip_gz(expanded)
    if base.endswith(".jsonl"):
        opener = gzip.open if gz else open
        try:
            with opener(expanded, "rb") as f:
                yield from _iter_jsonl(f, expanded)
        except (OSError, EOFError) as e:
            raise DataError(
                f"cannot read {path}: {e}. It must be UTF-8 JSON Lines (one object per line)"
                + (", gzip-compressed" if gz else "") + "; re-export it or pass the right file."
            ) from e
    elif base.endswith(".parquet") and not gz:
        yield from _iter_parquet(expanded)
    else:
        yield from _read_file(expanded)


def _iter_parquet(path: str, batch_rows: int = 1024) -> Iterator[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # pyarrow ships with `datasets`, so this means a broken install
        raise DataError(f"reading {path} needs pyarrow (pip install pyarrow)") from e
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=batch_rows)
        index = 0
        for batch in batches:
            for o in batch.to_pylist():
                index += 1
                yield Row(data=o, source=path, index=index)
    except Exception as e:  # pyarrow raises several unrelated types for a corrupt file
        raise DataError(f"cannot read parquet file {path}: {e}") from e


def _read_parquet(path: str) -> list[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # pyarrow ships with `datasets`, so this means a broken install
        raise DataError(f"reading {path} needs pyarrow (pip install pyarrow)") from e
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several unrelated types for a corrupt file
        raise DataError(f"cannot read parquet file {path}: {e}") from e
    return [Row(data=o, source=path, index=i) for i, o in enumerate(table.to_pylist(), start=1)]


def _is_saved_dataset(folder: str) -> bool:
    names = set(os.listdir(folder))
    return "dataset_dict.json" in names or ("state.json" in names and "dataset_info.json" in names)


def _read_folder(folder: str, split: str | None) -> list[Row]:
    if _is_saved_dataset(folder):
        return _read_saved_dataset(folder, split)
    names = sorted(os.listdir(folder))
    data_files = [n for n in names if _strip_gz(n)[0].endswith(_EXTENSIONS)]
    if split is None:
        if len(data_files) == 1:
            return _read_file(os.path.join(folder, data_files[0]))
        raise DataError(
            f"{folder} holds {len(data_files)} data files ({', '.join(data_files) or 'none'}); pass data.split=... "
            "(--split on the command line) or the path of one file."
        )
    matches = [n for n in data_files if _strip_gz(n)[0].rsplit(".", 1)[0] == split]
    if len(matches) != 1:
        raise DataError(
            f"{folder}: split {split!r} needs exactly one file named {split}.jsonl[.gz], {split}.json[.gz] or "
            f"{split}.parquet; found {matches or 'none'} among {data_files or 'no data files'}."
        )
    return _read_file(os.path.join(folder, matches[0]))


def _read_saved_dataset(folder: str, split: str | None) -> list[Row]:
    import datasets

    try:
        ds = datasets.load_from_disk(folder)
    except Exception as e:  # datasets raises FileNotFoundError, ValueError, pyarrow errors...
        raise DataError(f"cannot load the saved dataset in {folder}: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds.keys())
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in ds:
            raise DataError(f"{folder}: split {split!r} not found; it has {splits}. Pass data.split= (--split on the command line) one of them.")
        ds, source = ds[split], f"{folder}[{split}]"
    else:
        if split is not None:
            raise DataError(f"{folder} holds a single dataset without splits; drop data.split={split!r} (--split on the command line).")
        source = folder
    return [Row(data=dict(o), source=source, index=i) for i, o in enumerate(ds, start=1)]


def _read_hub(name: str, split: str | None) -> list[Row]:
    import datasets

    split = split or "train"
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # offline, unknown repo, unknown split, auth: all end the same way for the user
        raise DataError(
            f"dataset not found: {name!r} is neither a local path nor a reachable Hugging Face Hub dataset id "
            f"(split {split!r}): {type(e).__name__}: {e}"
        ) from e
    source = f"hf://{name}[{split}]"
    return [Row(data=dict(o), source=source, index=i) for i, o in enumerate(ds, start=1)]
