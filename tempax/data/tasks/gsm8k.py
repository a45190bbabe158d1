"""GSM8K (Cobbe et al. 2021, arXiv:2110.14168): grade-school math word problems with integer answers.

Rows come from a local JSON Lines file (`{"question": ..., "answer": "...\\n#### 72"}` per line), a folder holding
`train.jsonl` / `test.jsonl`, or a Hub id read with `datasets.load_dataset(id, "main")`; with no source, the Hub's
`openai/gsm8k`. A source that exists locally is always read locally (relative to the working directory).

Each row becomes `{prompt_messages, question, answer, target}`: chat messages (system instruction + question), the
question text, the reference number from after the final `####`, thousands commas removed ("1,080" -> "1080"), and
the worked solution as the ideal completion in the answer format (`worked_solution_target`), what an SFT
warm-start trains on.
Malformed rows are skipped and reported with their `file:line`; too many of them is a `DataError`.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from tempax.data.tasks.common import SYSTEM_PROMPT, SkippedRow, TaskRows, build_prompt_messages, format_target
from tempax.errors import DataError

logger = logging.getLogger(__name__)

GSM8K_HUB_ID = "openai/gsm8k"
GSM8K_HUB_CONFIG = "main"

_FINAL_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_CALCULATOR_MARK = re.compile(r"<<[^<>]*>>")


def parse_final_answer(solution: str) -> str | None:
    """The number after the last `####` of a GSM8K solution, commas removed; None when there is none."""
    if "####" not in solution:
        return None
    final = solution.rsplit("####", 1)[1].strip().replace(",", "")
    return final if _FINAL_NUMBER.fullmatch(final) else None


def worked_solution_target(solution: str, answer: str) -> str:
    """A GSM8K solution as the ideal completion: its steps (before the final `####`) as the reasoning, without the
    calculator marks the annotators left in them (`<<48/2=24>>`, which the answer format does not use), and the
    final number as the answer (`format_target`)."""
    steps = solution.rsplit("####", 1)[0]
    lines = [" ".join(_CALCULATOR_MARK.sub("", line).split()) for line in steps.strip().splitlines()]
    return format_target("\n".join(line for line in lines if line), answer)


def _row_from_record(record: Any, system_prompt: str | None) -> tuple[dict[str, Any] | None, str]:
    """A task row from one raw record, or (None, reason it is malformed)."""
    if not isinstance(record, dict):
        return None, f"expected a JSON object, got {type(record).__name__}"
    missing = [key for key in ("question", "answer") if key not in record]
    if missing:
        return None, f"missing key(s) {missing}"
    question, solution = record["question"], record["answer"]
    if not isinstance(question, str) or not isinstance(solution, str):
        return None, "'question' and 'answer' must be strings"
    if not question.strip():
        return None, "empty question"
    answer = parse_final_answer(solution)
    if answer is None:
        return None, "answer has no '#### <number>' final line"
    question = question.strip()
    row = {"prompt_messages": build_prompt_messages(question, system_prompt), "question": question, "answer": answer,
           "target": worked_solution_target(solution, answer)}
    return row, ""


def _resolve_local(source: str | Path, split: str) -> Path | None:
    """The jsonl file for `source` (a file, or a folder holding `{split}.jsonl`), or None if it does not exist."""
    path = Path(source).expanduser()
    if not path.exists():
        return None
    if path.is_dir():
        file = path / f"{split}.jsonl"
        if not file.is_file():
            found = sorted(p.name for p in path.glob("*.jsonl"))
            raise DataError(f"GSM8K folder {path} has no {split}.jsonl (found {found}); pass the file path instead")
        return file
    return path


def _read_jsonl(file: Path, system_prompt: str | None) -> tuple[list[dict[str, Any]], list[SkippedRow]]:
    rows, skipped = [], []
    with file.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue  # blank lines (a trailing newline, say) are not rows
            location = f"{file}:{line_number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                skipped.append(SkippedRow(location, f"not valid JSON ({err.msg})"))
                continue
            row, reason = _row_from_record(record, system_prompt)
            if row is None:
                skipped.append(SkippedRow(location, reason))
            else:
                rows.append(row)
    return rows, skipped


def _read_hub(hub_id: str, split: str, system_prompt: str | None) -> tuple[list[dict[str, Any]], list[SkippedRow]]:
    import datasets  # heavy import, only needed for the Hub fallback

    try:
        records = datasets.load_dataset(hub_id, GSM8K_HUB_CONFIG, split=split)
    except Exception as err:  # offline, unknown id, unknown split: all fixable by pointing at local files
        raise DataError(
            f"could not load GSM8K {split!r} from the Hub id {hub_id!r} ({type(err).__name__}: {err}); "
            f"set task.source (--source of `tempax eval` and `tempax demo`) to a local folder holding "
            f"{split}.jsonl, or a jsonl file"
        ) from err
    rows, skipped = [], []
    for index, record in enumerate(records):
        row, reason = _row_from_record(record, system_prompt)
        if row is None:
            skipped.append(SkippedRow(f"{hub_id}[{split}]:{index}", reason))
        else:
            rows.append(row)
    return rows, skipped


def load_gsm8k(
    split: str = "train",
    source: str | Path | None = None,
    *,
    system_prompt: str | None = SYSTEM_PROMPT,
    limit: int | None = None,
    max_malformed_fraction: float = 0.1,
) -> TaskRows:
    """Load GSM8K rows `{prompt_messages, question, answer}`.

    Args:
      split: "train" or "test"; picks `{split}.jsonl` in a folder, or the Hub split. Ignored for a file path.
      source: a jsonl file or a folder of them (relative to the working directory), or a Hub id: a source that
        does not exist locally but looks like `owner/name` is loaded from the Hub (config "main"). None means
        `GSM8K_HUB_ID`.
      system_prompt: the system turn of every prompt (None for no system turn).
      limit: keep only the first `limit` valid rows.
      max_malformed_fraction: raise `DataError` when a larger share of rows is malformed.
    """
    if source is None:
        source = GSM8K_HUB_ID
    file = _resolve_local(source, split)
    if file is not None:
        rows, skipped = _read_jsonl(file, system_prompt)
        where = str(file)
    elif _HUB_ID.fullmatch(str(source)) and not str(source).endswith(".jsonl"):
        rows, skipped = _read_hub(str(source), split, system_prompt)
        where = f"{source}[{split}]"
    else:
        raise DataError(f"GSM8K source {source} does not exist (a relative path is read from {Path.cwd()}); set "
                        "task.source (--source of `tempax eval` and `tempax demo`) to a jsonl file, a folder with "
                        "train.jsonl/test.jsonl, or a Hub id")

    total = len(rows) + len(skipped)
    if total == 0:
        raise DataError(f"{where} has no rows; expected one JSON object per line")
    if not rows or len(skipped) > max_malformed_fraction * total:
        examples = "; ".join(str(s) for s in skipped[:3])
        raise DataError(
            f"{where}: {len(skipped)} of {total} rows are malformed (first: {examples}); each line must be a JSON "
            'object {"question": str, "answer": "... #### <number>"}'
        )
    if skipped:
        logger.warning(
            "%s: skipped %d malformed rows: %s", where, len(skipped), "; ".join(str(s) for s in skipped[:5])
        )
    if limit is not None:
        rows = rows[:limit]
    return TaskRows(rows=rows, source=where, skipped=skipped)
