"""Completions in the answer format the reward tests score: `GOOD`, and `completion(...)` with other contents."""

from __future__ import annotations

GOOD = "<reasoning>\n23 + 48 = 71\n</reasoning>\n<answer>\n71\n</answer>"


def completion(reasoning: str = "23 + 48 = 71", answer: str = "71") -> str:
    return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{answer}\n</answer>"
