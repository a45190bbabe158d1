"""GRPO from Python with a reward function of your own (the README's third quick start).

    python examples/grpo_own_reward.py                      # 20 steps on the arithmetic task
    python examples/grpo_own_reward.py train.steps=2        # any recipe key, as on the command line
"""
import re
import sys

import tempax


def last_number_is_the_answer(prompts, completions, answer, **columns):
    """1.0 when the last number in the completion equals the row's `answer`, else 0.0."""
    numbers = [re.findall(r"-?\d+", c) for c in completions]
    return [float(bool(n) and n[-1] == a) for n, a in zip(numbers, answer)]


if __name__ == "__main__":
    run = tempax.train("grpo", "recipes/grpo_gsm8k_smollm2.yaml", [
        "task.name=arithmetic", "rewards.functions=[__main__:last_number_is_the_answer]", "rewards.weights=null",
        "train.steps=20", "eval.num_problems=32", "train.run_dir=runs/grpo_own_reward", *sys.argv[1:]])
    print(f"held-out answers: {run.before.answer_accuracy:.1%} -> {run.after.answer_accuracy:.1%}")
