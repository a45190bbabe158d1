"""The lookup tool over a dict, a jsonl file and a csv file."""

from __future__ import annotations

import pytest

from tempax.envs.lookup import lookup_tool, read_table
from tempax.envs.tool_calls import ToolCall
from tempax.envs.tools import call_tool
from tempax.errors import DataError


def test_lookup_matches_keys_loosely_and_suggests_close_ones():
    tools = {"capital": lookup_tool({"France": "Paris", "New Zealand": "Wellington"}, name="capital",
                                    description="The capital city of a country.")}
    assert call_tool(tools, ToolCall("capital", {"key": "  new   zealand "})).content == "Wellington"
    miss = call_tool(tools, ToolCall("capital", {"key": "Frence"}))
    assert miss.error and miss.content == "error: no entry for 'Frence'; close keys: ['france']"
    assert tools["capital"].schema["function"]["description"] == "The capital city of a country."


def test_tables_from_files(tmp_path):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"country": "Peru", "capital": "Lima"}\n\n{"country": "Chad", "capital": "N\'Djamena"}\n')
    assert read_table(jsonl, key="country", value="capital") == {"Peru": "Lima", "Chad": "N'Djamena"}
    table = tmp_path / "t.csv"
    table.write_text("country,capital\nPeru,Lima\n")
    assert read_table(table, key="country", value="capital") == {"Peru": "Lima"}


def test_bad_tables_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"country": "Peru", "capital": "Lima"}\n{"country": "Chad"}\n')
    with pytest.raises(DataError, match="bad.jsonl:2: the row needs a 'country' and a 'capital' column"):
        read_table(bad, key="country", value="capital")
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(DataError, match="broken.jsonl:1: not JSON"):
        read_table(broken, key="country", value="capital")
    with pytest.raises(DataError, match="does not exist"):
        read_table(tmp_path / "missing.csv", key="a", value="b")
    with pytest.raises(DataError, match="use a .jsonl or .csv file"):
        (tmp_path / "t.txt").write_text("x")
        read_table(tmp_path / "t.txt", key="a", value="b")
