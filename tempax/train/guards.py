"""The entropy-collapse guard: a hook for any RL algorithm that watches the signs of a policy running out of
exploration and warns, stops the run, or adjusts the sampling / loss (through the algorithm's `adjust`).

RL fine-tuning with verifiable rewards fails most often by collapse: the policy's token entropy falls, the G
completions of a prompt become the same text, every group gets one reward for all its completions (no advantage,
no gradient), and completions shrink. DAPO's clip-higher (Yu et al. 2025) and entropy bonuses (Williams & Peng
1991; the c2 S[pi] term of PPO, Schulman et al. 2017) are the usual remedies; a higher sampling temperature is the
bluntest. `CollapseGuard` says which metrics it reads and when it fires.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from tempax.configlib import help_field
from tempax.errors import ConfigError
from tempax.train.hooks import Hook, StepInfo, Stop
from tempax.train.metrics import read_metrics
from tempax.train.view import TrainerView

GUARD_ACTIONS = ("warn", "stop", "raise_temperature", "clip_higher", "entropy_bonus")
ADJUSTMENTS = GUARD_ACTIONS[2:]

ENTROPY, ZERO_SPREAD, DUPLICATES, LENGTH = (
    "entropy", "groups/zero_spread_frac", "completion/duplicate_frac", "completion/length_mean",
)
TURN_ENTROPY_PREFIX = "entropy/turn_"


def _is_entropy(name: str) -> bool:
    return name == ENTROPY or name.startswith(TURN_ENTROPY_PREFIX)


@dataclass(frozen=True)
class CollapseGuardConfig:
    """Entropy-collapse guard: thresholds and what to do when one is crossed (see tempax.train.guards)."""

    enabled: bool = help_field("Watch for collapse at all.", True)
    action: Literal["warn", "stop", "raise_temperature", "clip_higher", "entropy_bonus"] = help_field(
        "On collapse: warn (message + guard/* metrics), stop (checkpoint, exit status 3), raise_temperature, "
        "clip_higher (epsilon_high up to clip_high) or entropy_bonus (entropy_coef up to entropy_coef).",
        "warn",
    )
    baseline_steps: int = help_field("Entropy and length falls are measured against their mean over these first steps.", 3)
    window: int = help_field("Each signal is its mean over the last N steps (one noisy step does not fire).", 2)
    max_entropy_drop: float = help_field(
        "Fire when mean entropy is more than this fraction below its baseline (0.75: under a quarter of it); "
        "1: off.",
        0.75,
    )
    min_entropy: float = help_field("Fire when mean entropy (nats per token) is below this; 0: off.", 0.0)
    max_zero_spread_frac: float = help_field(
        "Fire when more than this fraction of groups had one reward for all completions; 1: off.", 0.9
    )
    max_duplicate_frac: float = help_field(
        "Fire when more than this fraction of completions repeat an earlier one of their group; 1: off.", 0.9
    )
    max_length_drop: float = help_field(
        "Fire when mean completion length is more than this fraction below its baseline; 1: off.", 0.75
    )
    cooldown_steps: int = help_field("Steps after firing before the guard fires again.", 5)
    temperature_step: float = help_field("raise_temperature: add this to the sampling temperature each time.", 0.3)
    max_temperature: float = help_field("raise_temperature: never above this.", 1.5)
    clip_high: float = help_field("clip_higher: the upper clip range (DAPO: 0.28).", 0.28)
    entropy_coef: float = help_field("entropy_bonus: the entropy coefficient it switches on.", 0.01)

    def validate(self) -> None:
        if self.action not in GUARD_ACTIONS:
            raise ConfigError(f"guard.action must be one of {', '.join(GUARD_ACTIONS)}, got {self.action!r}")
        if self.baseline_steps < 1 or self.window < 1 or self.cooldown_steps < 0:
            raise ConfigError("guard.baseline_steps and guard.window must be >= 1, guard.cooldown_steps >= 0")
        for name in ("max_entropy_drop", "max_zero_spread_frac", "max_duplicate_frac", "max_length_drop"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ConfigError(f"guard.{name} must be in (0, 1] (1 turns the check off), got {getattr(self, name)}")
        if self.min_entropy < 0 or self.temperature_step <= 0 or self.clip_high <= 0 or self.entropy_coef <= 0:
            raise ConfigError("guard.min_entropy must be >= 0; temperature_step, clip_high and entropy_coef > 0")


@dataclass
class GuardEvent:
    """One firing: the step, the signals that crossed (name -> (value, threshold)), the message, the action taken
    and the change an adjustment made (None for warn/stop)."""

    step: int
    signals: dict[str, tuple[float, float]]
    message: str
    action: str
    change: str | None = None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@dataclass
class _Series:
    values: list[float] = field(default_factory=list)

    def baseline(self, n: int) -> float | None:
        return _mean(self.values[:n]) if len(self.values) > n else None  # a later step exists to compare

    def recent(self, n: int) -> float | None:
        return _mean(self.values[-n:]) if len(self.values) >= n else None


class CollapseGuard(Hook):
    """The guard hook. It reads the step metrics every RL algorithm here logs, by name:

        entropy                    mean per-token policy entropy (nats), computed in the loss, chunked over vocab
        groups/zero_spread_frac    fraction of groups whose completions all got the same reward
        completion/duplicate_frac  fraction of completions that repeat an earlier one of their group
        completion/length_mean     mean completion length (tokens)
        entropy/turn_<k>           multi-turn episodes: the sampled tokens' mean -log p of reply k (one estimate
                                   per turn, so a policy that turns deterministic on one turn only, e.g. its tool
                                   calls, is seen although the mean over all tokens hides it); same thresholds as
                                   entropy

    Each signal is the mean over the last `window` steps; entropy and length are compared with their mean over the
    first `baseline_steps` steps. When a threshold is crossed the guard logs `guard/*` numbers into that step's
    record (`guard/fired`, the values and thresholds, `guard/message`), prints a message that says what collapsed
    and which settings to change, and then acts (`action`): `warn`, `stop` (ends the run with a checkpoint and exit
    status 3), or one of the adjustments the algorithm offers (`raise_temperature`, `clip_higher`,
    `entropy_bonus`). It fires again only after `cooldown_steps`, so an adjustment has time to act. On resume it
    replays the logged metrics up to the checkpoint, so its baselines and cooldown are those of the uninterrupted
    run.

    Args:
      config: thresholds and action.
      adjust: `adjust(action) -> str` applies an adjustment (`raise_temperature`, `clip_higher`,
        `entropy_bonus`) from the next rollout on and describes the change ("temperature 0.5 -> 0.8"); required for
        those actions.
      advice: `advice() -> str`, the algorithm's concrete remedies with their current values (config keys).
    """

    def __init__(self, config: CollapseGuardConfig, *, adjust: Callable[[str], str] | None = None,
                 advice: Callable[[], str] | None = None):
        super().__init__(every=1, at_end=False)
        if config.action in ADJUSTMENTS and adjust is None:
            raise ConfigError(f"guard.action={config.action} needs an algorithm that can adjust itself; use warn or stop")
        self.config = config
        self.adjust = adjust
        self.advice = advice
        self.events: list[GuardEvent] = []
        self._series: dict[str, _Series] = {}
        self._last_fired: int | None = None

    # -- state ------------------------------------------------------------------------------------------------
    def start(self, trainer: TrainerView) -> None:
        """Fresh state; on a resumed run, the logged history up to the restored step replayed (no actions)."""
        self.events, self._series, self._last_fired = [], {}, None
        if trainer.step == 0:
            return

        try:
            records = read_metrics(trainer.run_dir)
        except ConfigError:
            return
        for record in records:
            if 0 < record.get("step", 0) <= trainer.step and not any(k.startswith("eval/") for k in record):
                if self._observe(int(record["step"]), record):
                    self._last_fired = int(record["step"])

    def _observe(self, step: int, metrics: dict[str, Any]) -> dict[str, tuple[float, float]]:
        """Adds a step's signals; returns those that crossed their thresholds (empty during the cooldown)."""
        turns = sorted(k for k in metrics if k.startswith(TURN_ENTROPY_PREFIX))
        for name in (ENTROPY, ZERO_SPREAD, DUPLICATES, LENGTH, *turns):
            value = metrics.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._series.setdefault(name, _Series()).values.append(float(value))
        if self._last_fired is not None and step - self._last_fired <= self.config.cooldown_steps:
            return {}
        return self._crossed()

    def _crossed(self) -> dict[str, tuple[float, float]]:
        c = self.config
        out: dict[str, tuple[float, float]] = {}
        entropies = [n for n in self._series if _is_entropy(n)]
        for name, max_drop in (*((n, c.max_entropy_drop) for n in entropies), (LENGTH, c.max_length_drop)):
            s = self._series.get(name)
            if s is None or max_drop >= 1.0:
                continue
            base, now = s.baseline(c.baseline_steps), s.recent(c.window)
            if base is not None and now is not None and len(s.values) > c.baseline_steps and base > 0:
                if now < (1.0 - max_drop) * base:
                    out[f"{name}_drop"] = (1.0 - now / base, max_drop)
        for name in entropies:
            s = self._series[name]
            if c.min_entropy > 0 and (now := s.recent(c.window)) is not None and now < c.min_entropy:
                out[f"{name}_min"] = (now, c.min_entropy)
        for name, limit in ((ZERO_SPREAD, c.max_zero_spread_frac), (DUPLICATES, c.max_duplicate_frac)):
            s = self._series.get(name)
            if s is not None and limit < 1.0 and (now := s.recent(c.window)) is not None and now > limit:
                out[name] = (now, limit)
        return out

    # -- the hook -----------------------------------------------------------------------------------------------
    def __call__(self, info: StepInfo) -> Stop | None:
        if not self.config.enabled:
            return None
        crossed = self._observe(info.step, info.metrics())
        if not crossed:
            return None
        self._last_fired = info.step
        c = self.config
        message = self._message(crossed)
        change = self.adjust(c.action) if c.action in ADJUSTMENTS and self.adjust is not None else None
        if change:
            message += f" Adjusted ({c.action}): {change}."
        self.events.append(GuardEvent(info.step, crossed, message, c.action, change))
        record: dict[str, Any] = {"guard/fired": 1.0, "guard/action": c.action, "guard/message": message}
        for name, (value, limit) in crossed.items():
            record[f"guard/{name}"] = value
            record[f"guard/{name}_threshold"] = limit
        info.add_metrics(record)
        info.trainer.write(f"collapse guard, step {info.step}: {message}")
        return Stop(f"collapse guard at step {info.step}: {message}") if c.action == "stop" else None

    def _message(self, crossed: dict[str, tuple[float, float]]) -> str:
        c = self.config
        parts = []
        ent, length = self._series.get(ENTROPY), self._series.get(LENGTH)
        w, b = c.window, c.baseline_steps
        if "entropy_drop" in crossed and ent is not None:
            drop, limit = crossed["entropy_drop"]
            parts.append(f"policy entropy fell to {ent.recent(w):.3f} nats/token (mean of the last {w} steps) from "
                         f"{ent.baseline(b):.3f} over the first {b} steps, {drop:.0%} down "
                         f"(guard.max_entropy_drop={limit:g})")
        if "entropy_min" in crossed:
            value, limit = crossed["entropy_min"]
            parts.append(f"policy entropy {value:.3f} nats/token is below guard.min_entropy={limit:g}")
        for name in sorted(k for k in crossed if k.startswith(TURN_ENTROPY_PREFIX)):
            value, limit = crossed[name]
            turn = name[len(TURN_ENTROPY_PREFIX):].split("_")[0]
            if name.endswith("_drop"):
                parts.append(f"turn {turn}'s sampled entropy fell {value:.0%} from its first steps "
                             f"(guard.max_entropy_drop={limit:g})")
            else:
                parts.append(f"turn {turn}'s sampled entropy {value:.3f} nats/token is below "
                             f"guard.min_entropy={limit:g}")
        if ZERO_SPREAD in crossed:
            value, limit = crossed[ZERO_SPREAD]
            parts.append(f"{value:.0%} of groups gave every completion the same reward, so they carry no gradient "
                         f"(guard.max_zero_spread_frac={limit:g})")
        if DUPLICATES in crossed:
            value, limit = crossed[DUPLICATES]
            parts.append(f"{value:.0%} of completions repeat another of their group "
                         f"(guard.max_duplicate_frac={limit:g})")
        if f"{LENGTH}_drop" in crossed and length is not None:
            drop, limit = crossed[f"{LENGTH}_drop"]
            parts.append(f"completions shrank to {length.recent(w):.1f} tokens from {length.baseline(b):.1f}, "
                         f"{drop:.0%} down (guard.max_length_drop={limit:g})")
        entropy = any(k.startswith("entropy") for k in crossed)
        what = "entropy collapse" if entropy else "exploration collapse"
        advice = self.advice() if self.advice is not None else (
            "raise the sampling temperature, widen the upper clip range (clip-higher), add an entropy bonus or "
            "lower the learning rate")
        why = ("The policy is turning deterministic; to keep it exploring" if entropy or DUPLICATES in crossed else
               "Without reward differences inside a group there is nothing to learn; to get them back")
        return f"{what}: {'; '.join(parts)}. {why}, {advice}."
