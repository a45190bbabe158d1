"""Writes `docs/results.md`, the one page that quotes measured figures, from the benches' JSON records.

    python bench/results.py                 # bench/records/*.jsonl -> docs/results.md
    python bench/results.py --check         # exit 1 when docs/results.md is not what the records give

A record is one JSON object per line in a `bench/records/<topic>.jsonl` file, kept with the project so the page
can be written again on any machine. Two kinds:

  {"kind": "figure", "topic": ..., "what": ..., "figure": ..., "command": ..., "cpu": ..., "versions": ...}
      one measured figure (a ratio against a peer measured in the same run, a rate with its interval, ...);
  {"kind": "table", "topic": ..., "title": ..., "columns": [...], "rows": [[...], ...], "command": ..., "cpu": ...,
   "notes": ...}
      a whole table, as `bench/learning.py --record FILE` writes its learning table.

A bench adds a record with `--record FILE` (or its JSON output line is appended to the topic's file); the page
is never edited by hand. Topics are shown in the order of TOPICS, then any other topic by name; within a topic,
records keep their file order. Every figure names its CPU and the command that repeats it, because a ratio
belongs to the machine it was measured on.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = os.path.join(ROOT, "bench", "records")
PAGE = os.path.join(ROOT, "docs", "results.md")

TOPICS = {
    "demo": "The demo",
    "learning": "Does training help?",
    "speed": "Speed against the peers",
    "serving": "Serving and decoding",
    "async-rl": "Asynchronous RL",
    "tools": "Agentic RL",
    "code": "Code execution",
    "correctness": "Correctness against transformers",
    "start-up": "Start-up",
    "gpu": "GPU",
    "tpu": "TPU v5e",
    "suite": "The test suite",
}

REQUIRED = {"figure": ("topic", "what", "figure", "command", "cpu"),
            "table": ("topic", "title", "columns", "rows", "command", "cpu")}


class RecordError(ValueError):
    """A record that cannot go on the page; the message names the file, the line and what is missing."""


def read_records(folder: str = RECORDS) -> list[dict]:
    records = []
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{os.path.relpath(path, ROOT)}:{n}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise RecordError(f"{where}: not JSON ({e})") from None
                kind = record.get("kind")
                if kind not in REQUIRED:
                    raise RecordError(f"{where}: 'kind' must be one of {sorted(REQUIRED)}, not {kind!r}")
                missing = [k for k in REQUIRED[kind] if record.get(k) in (None, "")]
                if missing:
                    raise RecordError(f"{where}: a {kind} record needs {', '.join(missing)}")
                if kind == "table" and any(len(r) != len(record["columns"]) for r in record["rows"]):
                    raise RecordError(f"{where}: every row needs {len(record['columns'])} cells")
                records.append(record)
    return records


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render(records: list[dict]) -> str:
    order = {topic: i for i, topic in enumerate(TOPICS)}
    topics = sorted({r["topic"] for r in records}, key=lambda t: (order.get(t, len(order)), t))
    out = ["# Results", "",
           "Every measured figure of the project, each with the CPU it was measured on and the command that repeats "
           "it. Written by `python bench/results.py` from the records in `bench/records/`; do not edit by hand. A "
           "speed figure is a ratio against a peer measured on the same machine in the same run: compare ratios, "
           "never absolute figures, across machines.", ""]
    for topic in topics:
        out += [f"## {TOPICS.get(topic, topic)}", ""]
        mine = [r for r in records if r["topic"] == topic]
        figures = [r for r in mine if r["kind"] == "figure"]
        if figures:
            out += ["| what | figure | CPU | command |", "|---|---|---|---|"]
            out += [f"| {_cell(r['what'])} | {_cell(r['figure'])} | {_cell(r['cpu'])} | `{_cell(r['command'])}` |"
                    for r in figures]
            out.append("")
        for r in (r for r in mine if r["kind"] == "table"):
            out += [f"### {r['title']}", "", f"CPU: {r['cpu']}. Command: `{r['command']}`"
                    + (f". Versions: {r['versions']}" if r.get("versions") else ""), ""]
            out += ["| " + " | ".join(_cell(c) for c in r["columns"]) + " |",
                    "|" + "---|" * len(r["columns"])]
            out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in r["rows"]]
            out.append("")
            if r.get("notes"):
                out += [r["notes"], ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default=RECORDS, help="folder of <topic>.jsonl record files")
    parser.add_argument("--page", default=PAGE, help="the page to write")
    parser.add_argument("--check", action="store_true", help="only compare the page with what the records give")
    args = parser.parse_args(argv)
    try:
        text = render(read_records(args.records))
    except RecordError as e:
        print(f"bench/results.py: {e}", file=sys.stderr)
        return 2
    if args.check:
        current = open(args.page, encoding="utf-8").read() if os.path.exists(args.page) else ""
        if current != text:
            print(f"{os.path.relpath(args.page, ROOT)} is not what bench/records gives; run: python bench/results.py",
                  file=sys.stderr)
            return 1
        return 0
    with open(args.page, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(args.page, ROOT)} from {len(read_records(args.records))} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
