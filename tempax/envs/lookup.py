"""A lookup tool over a local table: a dict, or a jsonl / csv file with a key column and a value column.

Keys match case-insensitively with runs of whitespace folded, so "  new york" finds "New York". A missing key is
refused with up to three close keys, so the model can retry with a spelling the table has. The table is read
once, when the tool is built; nothing is fetched at call time.
"""

from __future__ import annotations

import csv
import difflib
import json
import os
from typing import Any, Mapping

from tempax.envs.tools import Tool, ToolRefusal
from tempax.errors import DataError


def _normal(key: str) -> str:
    return " ".join(str(key).split()).casefold()


def read_table(path: str | os.PathLike, *, key: str, value: str) -> dict[str, str]:
    """`{row[key]: row[value]}` of a `.jsonl` or `.csv` file; a row missing either column is a `DataError` naming
    the file and line."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DataError(f"lookup table {path!r} does not exist")
    table: dict[str, str] = {}
    with open(path, newline="", encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            rows = []
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append((line_no, json.loads(line)))
                    except json.JSONDecodeError as e:
                        raise DataError(f"{path}:{line_no}: not JSON ({e.msg})") from None
        elif path.endswith(".csv"):
            rows = list(enumerate(csv.DictReader(f), 2))  # line 1 is the header
        else:
            raise DataError(f"lookup table {path!r}: use a .jsonl or .csv file")
    for line_no, row in rows:
        if not isinstance(row, dict) or key not in row or value not in row:
            raise DataError(f"{path}:{line_no}: the row needs a {key!r} and a {value!r} column")
        table[str(row[key])] = str(row[value])
    return table


def lookup_tool(table: Mapping[str, Any], *, name: str = "lookup", description: str | None = None) -> Tool:
    """A `Tool` answering `lookup(key)` from `table` (key -> value)."""
    by_key = {_normal(k): str(v) for k, v in table.items()}

    def lookup(key: str) -> str:
        found = by_key.get(_normal(key))
        if found is not None:
            return found
        close = difflib.get_close_matches(_normal(key), list(by_key), n=3)
        hint = f"; close keys: {close}" if close else ""
        raise ToolRefusal(f"no entry for {key!r}{hint}")

    lookup.__doc__ = (
        f"{description or 'Looks up a value in a table by its key.'}\n\n"
        "Args:\n  key: the key to look up (case and extra spaces do not matter).\n"
    )
    return Tool.from_function(lookup, name=name)
