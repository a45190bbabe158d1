"""Sequence-level knowledge distillation (Kim & Rush 2016, "Sequence-level knowledge distillation"): the teacher
answers the dataset's prompts, and the student is trained on those answers as an SFT dataset.

Kim & Rush approximate the teacher's mode with beam search; we take the teacher's greedy (temperature 0) or sampled
completions from `tempax.generate`. Each training row's prompt is everything before its last assistant turn (a
chat row) or its `prompt` (a prompt/completion row); the written row is

    {"prompt": [...messages before the reply...], "completion": "<the teacher's reply>", "source_row": "<where>"}

so only the teacher's reply carries loss. The file is an ordinary SFT dataset: `tempax sft data.path=...` trains
on it too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tempax.configlib import help_field
from tempax.errors import ConfigError, DataError
from tempax.data.formats import RowError, as_turns, detect_format, parse_messages
from tempax.generate import SamplingConfig, generate


@dataclass(frozen=True)
class SequenceKDConfig:
    """Teacher generations for sequence-level KD (`mode: sequence`)."""

    max_prompts: int | None = help_field("Answer at most this many training prompts (the first N rows); null: all.", 256)
    max_new_tokens: int = help_field("Most tokens per teacher reply.", 128)
    temperature: float = help_field("Teacher sampling temperature; 0: greedy (Kim & Rush's mode approximation).", 0.0)
    batch_size: int = help_field("Prompts per generation call.", 16)
    output: str | None = help_field("Where the generated SFT jsonl goes; null: <run_dir>/teacher_generations.jsonl.", None)
    reuse: bool = help_field("Reuse the output file when it already exists (e.g. a second run on the same prompts).", True)

    def validate(self) -> None:
        if self.max_prompts is not None and self.max_prompts < 1:
            raise ConfigError(f"sequence.max_prompts must be >= 1 or null, got {self.max_prompts}")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ConfigError("sequence.max_new_tokens and sequence.batch_size must be >= 1")
        if self.temperature < 0:
            raise ConfigError(f"sequence.temperature must be >= 0 (0: greedy), got {self.temperature}")


def prompt_turns(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation a training row asks the model to continue: the turns before its last assistant message
    (chat rows) or its prompt (prompt/completion rows). Raises `RowError` for a row without a prompt."""
    fmt = detect_format(data)
    if fmt == "messages":
        messages = parse_messages(data["messages"])
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages))
        if last == 0:
            raise RowError("no_prompt", "the conversation opens with the assistant; there is no prompt to answer")
        return messages[:last]
    if fmt == "prompt_completion":
        return as_turns(data["prompt"], "user", "prompt")
    raise RowError("no_prompt", "a plain-text row has no prompt; sequence-level KD needs chat or prompt/completion rows")


@dataclass
class Prompts:
    """The answerable prompts of a dataset: chat turns, their token ids (chat template with the generation
    prompt) and the row each came from."""

    turns: list[list[dict[str, Any]]]
    ids: list[list[int]]
    sources: list[str]


def answerable_prompts(
    rows: Sequence[Any], tokenizer: Any, *, max_len: int, max_new_tokens: int, say: Callable[[str], None] = print,
) -> Prompts:
    """The prompts of `rows` (`prompt_turns`) that leave room for `max_new_tokens` within `max_len` tokens.

    Rows without a prompt, malformed rows and prompts too long are skipped and counted (reported with `say`);
    `DataError` when none is left.
    """
    out = Prompts([], [], [])
    skipped: dict[str, int] = {}
    for row in rows:
        try:
            if row.data is None:
                raise RowError(row.error or "invalid_row", "")
            turns = prompt_turns(row.data)
        except RowError as e:
            skipped[e.reason] = skipped.get(e.reason, 0) + 1
            continue
        tokens = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
        if len(tokens) + max_new_tokens > max_len:
            skipped["prompt_too_long"] = skipped.get("prompt_too_long", 0) + 1
            continue
        out.turns.append(turns)
        out.ids.append(list(tokens))
        out.sources.append(row.where)
    if skipped:
        say("prompts: skipped " + ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())))
    if not out.ids:
        raise DataError(
            f"none of the {len(rows)} rows has a prompt that leaves {max_new_tokens} tokens of reply within "
            f"{max_len} tokens ({skipped}); use chat or prompt/completion rows, or raise train.seq_len"
        )
    return out


def teacher_generations(
    teacher: Any,
    tokenizer: Any,
    rows: Sequence[Any],
    spec: SequenceKDConfig,
    *,
    max_len: int,
    seed: int = 0,
    say: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """The teacher's reply to each answerable prompt of `rows` (`answerable_prompts`), as prompt/completion dicts
    (module docstring); empty replies are left out."""
    rows = list(rows)[: spec.max_prompts] if spec.max_prompts else list(rows)
    prompts = answerable_prompts(rows, tokenizer, max_len=max_len, max_new_tokens=spec.max_new_tokens, say=say)
    sampling = SamplingConfig(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, seed=seed)
    out: list[dict[str, Any]] = []
    ids = prompts.ids
    for start in range(0, len(ids), spec.batch_size):
        result = generate(teacher, tokenizer, ids[start:start + spec.batch_size], sampling, prompt_offset=start)
        for j, text in enumerate(result.texts):
            i = start + j
            if text.strip():
                out.append({"prompt": prompts.turns[i], "completion": text, "source_row": prompts.sources[i]})
        say(f"sequence KD: {min(start + spec.batch_size, len(ids))}/{len(ids)} prompts answered")
    return out


def write_jsonl(rows: Sequence[dict[str, Any]], path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)  # a half-written file is never mistaken for a finished one by `reuse`
    return path
