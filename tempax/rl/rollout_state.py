"""Rollouts and prompts as JSON-able values and back, bit for bit: what a checkpoint stores of rollouts that were
sampled but not yet trained on (`tempax.rl.async_source`), and what a request to a rollout worker carries."""

from __future__ import annotations

from typing import Any

import numpy as np

from tempax.rl.rollout import Prompt, Rollout
from tempax.train.sources import decode_arrays, encode_arrays

_ARRAYS = ("completion_tokens", "completion_mask", "logprobs", "lengths", "truncated", "rewards", "advantages",
           "zero_spread")
_OPTIONAL_ARRAYS = ("turns", "turn_of")  # multi-turn episodes only (None for one-turn rollouts)


def prompt_to_json(prompt: Prompt) -> dict[str, Any]:
    return {"ids": list(prompt.ids), "text": prompt.text, "columns": dict(prompt.columns)}


def prompt_from_json(value: dict[str, Any]) -> Prompt:
    return Prompt(ids=tuple(int(i) for i in value["ids"]), text=value["text"], columns=dict(value["columns"]))


def rollout_to_json(rollout: Rollout) -> dict[str, Any]:
    """Every field of `rollout`; the arrays as `encode_arrays` (exact bytes), a multi-turn rollout's turns, turn
    positions and environment counters included."""
    arrays = {name: np.asarray(getattr(rollout, name)) for name in _ARRAYS}
    arrays.update({name: np.asarray(getattr(rollout, name)) for name in _OPTIONAL_ARRAYS
                   if getattr(rollout, name) is not None})
    arrays.update({f"part:{k}": np.asarray(v) for k, v in rollout.reward_parts.items()})
    arrays.update({f"env:{k}": np.asarray(v) for k, v in rollout.env_metrics.items()})
    return {
        "prompts": [prompt_to_json(p) for p in rollout.prompts], "texts": [list(t) for t in rollout.texts],
        "arrays": encode_arrays(arrays), "reward_failures": dict(rollout.reward_failures),
        "seconds": dict(rollout.seconds), "groups_sampled": rollout.groups_sampled,
        "zero_spread_sampled": rollout.zero_spread_sampled, "prefilled_tokens": rollout.prefilled_tokens,
        "reprefill_tokens": rollout.reprefill_tokens,
    }


def rollout_from_json(value: dict[str, Any]) -> Rollout:
    """The inverse of `rollout_to_json`."""
    arrays = decode_arrays(value["arrays"])
    return Rollout(
        prompts=[prompt_from_json(p) for p in value["prompts"]], texts=[list(t) for t in value["texts"]],
        **{name: arrays[name] for name in _ARRAYS},
        reward_parts={k[len("part:"):]: v for k, v in arrays.items() if k.startswith("part:")},
        reward_failures={k: int(v) for k, v in value["reward_failures"].items()},
        seconds={k: float(v) for k, v in value["seconds"].items()}, groups_sampled=int(value["groups_sampled"]),
        zero_spread_sampled=int(value["zero_spread_sampled"]),
        **{name: arrays.get(name) for name in _OPTIONAL_ARRAYS},
        env_metrics={k[len("env:"):]: v for k, v in arrays.items() if k.startswith("env:")},
        # A state written before these were kept holds neither: read as none prefilled.
        prefilled_tokens=int(value.get("prefilled_tokens", 0)), reprefill_tokens=int(value.get("reprefill_tokens", 0)),
    )
