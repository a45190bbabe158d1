"""Experiments: algorithm runs chained on one model in memory and compared on the same held-out problems.

    stages.py    a stage's algorithm run on the in-memory model (SFT, GRPO, RFT), adapters merged for the next
    budget.py    a stopwatch of wall and process-CPU seconds, and the hook that ends a stage at another's budget
    pipeline.py  `Pipeline`: stages evaluated alike in order, their outcomes written as they come
    tables.py    each stage's accuracy with Wilson intervals, paired differences with Newcombe's interval
    plots.py     a run's metric curves as a PNG
    demo.py      `tempax demo`: base -> SFT warm-start -> GRPO, and the scarce-demonstration comparison
    tool_demo.py `tempax demo --task arithmetic-tools`: RL with and without a calculator tool
    episodes.py  a recipe's environment played with a policy, written as transcripts (`tempax data episodes`)

The layer sits above `tempax.algorithms` (it calls their `main`s) and under `tempax.cli`, which only parses the
demos' flags and runs them. Nothing heavy is imported here.
"""
