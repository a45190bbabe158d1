"""Pieces shared by the verifiable tasks: the system prompt, chat prompts, SFT targets and loaded-row bookkeeping."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# Describes the output format in words on purpose. It must not contain a copyable block that already passes the
# strict format check (an example such as "<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"): a policy
# that copies such a block collects format reward without solving anything, which a measured GRPO run did within
# 8 steps. Copying any piece of this sentence gives at most the partial format credit. It is also short, since
# the prompt is repeated for every sample and dominated GRPO compute on CPU.
SYSTEM_PROMPT = (
    "Solve the problem. Write your step-by-step working between <reasoning> and </reasoning>, "
    "then only the final number between <answer> and </answer>. Put each tag on its own line."
)


def build_prompt_messages(question: str, system_prompt: str | None = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """Chat messages for one problem: the system instruction (if any), then the question as the user turn."""
    messages = [] if not system_prompt else [{"role": "system", "content": system_prompt}]
    messages.append({"role": "user", "content": question})
    return messages


def format_target(reasoning: str, answer: str) -> str:
    """The ideal completion: `<reasoning>\\n{reasoning}\\n</reasoning>\\n<answer>\\n{answer}\\n</answer>`."""
    return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{answer}\n</answer>"


@dataclass(frozen=True)
class SkippedRow:
    """A malformed input row: where it is (`file:line`, or `hub_id[split]:index`) and why it was skipped."""

    location: str
    reason: str

    def __str__(self) -> str:
        return f"{self.location}: {self.reason}"


@dataclass
class TaskRows:
    """Rows of a task (plain dicts) plus the malformed rows that were skipped; iterates and indexes like a list."""

    rows: list[dict[str, Any]]
    source: str
    skipped: list[SkippedRow] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]
