"""Verifiable tasks: rows with chat prompts and reference answers that reward functions can check.

Rows are plain dicts: `prompt_messages` (chat messages: system instruction + question), `question`, `answer`
(reference number as text) and, for generated tasks, `target` (the ideal completion, for SFT warm-starts).
"""

from tempax.data.tasks.arithmetic import ArithmeticConfig, generate_arithmetic, is_heldout_question
from tempax.data.tasks.common import SYSTEM_PROMPT, SkippedRow, TaskRows, build_prompt_messages, format_target
from tempax.data.tasks.gsm8k import GSM8K_HUB_ID, load_gsm8k, parse_final_answer

__all__ = [
    "GSM8K_HUB_ID",
    "SYSTEM_PROMPT",
    "ArithmeticConfig",
    "SkippedRow",
    "TaskRows",
    "build_prompt_messages",
    "format_target",
    "generate_arithmetic",
    "is_heldout_question",
    "load_gsm8k",
    "parse_final_answer",
]
