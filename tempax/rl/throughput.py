"""The time split of an on-policy step (generation vs training), shared by GRPO and PPO."""

from __future__ import annotations

from tempax.train.hooks import Hook, StepInfo


class ThroughputSplit(Hook):
    """Adds the step's time split to its record: `perf/train_s` (forward + backward + update), `perf/step_s`
    (waiting for the batch + training) and `perf/generation_frac`. Due every step, so every step is timed (the
    loop then waits for each step: the rollout of the next one needs its weights anyway)."""

    def __init__(self) -> None:
        super().__init__(every=1, at_end=True)

    def __call__(self, info: StepInfo) -> None:
        step_s = info.data_s + info.train_s
        gen_s = info.metrics().get("perf/generation_s", 0.0)
        info.add_metrics({"perf/train_s": info.train_s, "perf/step_s": step_s,
                          "perf/generation_frac": gen_s / max(step_s, 1e-9)})
