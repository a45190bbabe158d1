"""Reward functions: pure functions of text that score completions (they never execute model output).

A reward function is any callable `fn(prompts, completions, **dataset_columns) -> list[float]`, with dataset
columns (such as `answer`) passed as lists aligned with `completions`. `combine_rewards` turns several into one
weighted, failure-safe function whose result keeps each function's values for logging.
"""

from tempax.rewards.combine import (
    DEFAULT_TIMEOUT_S,
    CombinedReward,
    RewardBreakdown,
    RewardFn,
    RewardTimeout,
    SafeReward,
    combine_rewards,
    per_completion,
    safe_reward,
    time_limit,
)
from tempax.rewards.correctness import (
    CompletionCheck,
    answer_correctness_reward,
    answers_match,
    check_completions,
    find_numbers,
    reference_answer,
)
from tempax.rewards.formatting import (
    TAGS,
    extract_answer,
    format_reward,
    format_score,
    is_placeholder,
    strict_format_ok,
    tags_in_order,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TAGS",
    "CombinedReward",
    "CompletionCheck",
    "RewardBreakdown",
    "RewardFn",
    "RewardTimeout",
    "SafeReward",
    "answer_correctness_reward",
    "answers_match",
    "check_completions",
    "combine_rewards",
    "extract_answer",
    "find_numbers",
    "format_reward",
    "format_score",
    "is_placeholder",
    "reference_answer",
    "per_completion",
    "safe_reward",
    "strict_format_ok",
    "tags_in_order",
    "time_limit",
]
