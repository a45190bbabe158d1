"""The `tempax ...` commands the README and the guides show, as written, for the tests that check them.

A command is a line of a fenced code block of README.md or docs/*.md that starts with `tempax ` (after optional
`NAME=value` environment assignments, kept in the text), without its trailing `# comment`. A line whose second
word ends in a colon (`tempax sft: error: ...`) is printed output, not a command.
"""

from __future__ import annotations

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

_ENV_ASSIGNMENT = r"(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
_COMMAND = re.compile(rf"^{_ENV_ASSIGNMENT}tempax\s+(\S+)")
_TRAILING_COMMENT = re.compile(r"\s+#(?:\s.*)?$")


def code_block_commands(path: str) -> list[str]:
    """The commands of `path`'s fenced code blocks, in order, each stripped of its trailing comment."""
    text = open(path, encoding="utf-8").read()
    out = []
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = _TRAILING_COMMENT.sub("", line.strip())
            found = _COMMAND.match(line)
            if found and not found.group(1).endswith(":"):
                out.append(line)
    return out


def documented_files() -> list[str]:
    """README.md and every guide under docs/, relative to the repository root."""
    return ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) for every command of the README and the guides, duplicates across files kept."""
    return [(name, command) for name in documented_files() for command in code_block_commands(os.path.join(ROOT, name))]


def code_block(path: str, first_line: str) -> str:
    """The fenced code block of `path` whose first line is `first_line` (the README's `# my_rewards.py`, a
    Python example's first import), as written; the tests that run a guide's example read it from here so that
    an edit of the guide is what they run."""
    text = open(path, encoding="utf-8").read()
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
        if block.splitlines() and block.splitlines()[0].strip() == first_line:
            return block
    raise LookupError(f"no code block of {path} starts with {first_line!r}")
