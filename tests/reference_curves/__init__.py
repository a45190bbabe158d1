"""Reference training curves: a few steps of every algorithm on a tiny random model and tiny local data.

`run_one(name, workdir)` for each name of `NAMES` trains SFT, continued pre-training, DPO, KTO, a reward
model, GRPO, RFT, PPO (against that reward model) and distillation through the same `tempax <command>` entry
points a recipe uses (`tempax.algorithms.registry.resolve`), and returns each run's per-step losses and rewards.
The stored curves (`<name>.json` beside this file, one per machine class with the
JAX version it was made with) are what `tests/algorithms/test_reference_curves.py` compares every later run
with, so a change that claims to move code without changing behaviour can show it changed no trajectory.

Regenerate (only when a change is meant to alter trajectories, and say why in the commit):

    TEMPAX_WRITE_REFERENCE_CURVES=1 .venv/bin/python -m pytest -q -p no:xdist tests/algorithms/test_reference_curves.py

The curves are written from inside pytest so that they are made under exactly the settings the test compares
under (`tests/conftest.py`'s eight virtual CPU devices).
"""

from __future__ import annotations

import json
import os
import platform
import random
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 3
VOCAB = 400
# One layer, tiny widths: compilation dominates, and a trajectory needs no depth to be checkable.
SMALL = {"vocab_size": VOCAB, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "num_kv_heads": 1,
         "head_dim": 16, "intermediate_size": 64}
WORDS = "bread salt water yeast flour fox dog capital France Paris numbers help merges quick brown lazy".split()
# Metrics that are measurements of the machine (time, throughput, memory), not of the trajectory.
MACHINE_WORDS = ("perf/", "time", "per_sec", "seconds", "memory", "bytes", "mfu", "throughput", "gib")


def cpu_model() -> str:
    """The machine class a stored curve is exact on: the CPU's model name and its vector-unit class, e.g.
    "AMD EPYC (AVX2)". The model name alone is not enough: one name covers parts with and without AVX-512,
    and XLA:CPU orders float32 sums by the vector width it compiles for."""
    from tempax.runtime.host import cpu_class, cpu_info

    info = cpu_info()
    return f"{info['model']} ({cpu_class(info)})"


def _write_jsonl(path: str, rows: list[dict[str, Any]]) -> str:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def _pairs(n: int, seed: int) -> list[dict[str, str]]:
    """Replies that start "Sure," are preferred over replies that start "No."."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.sample(WORDS, 2)
        rows.append({"prompt": f"Tell me about {a} and {b}.", "chosen": f"Sure, {b} {a}.", "rejected": f"No. {a} {b}."})
    return rows


def _chats(n: int) -> list[dict[str, Any]]:
    """Small arithmetic dialogues: 'What is 3 plus 4?' -> '3 plus 4 is 7.'"""
    rows = []
    for i in range(n):
        a, b = i % 7, (3 * i) % 5
        rows.append({"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                                  {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]})
    return rows


def _unpaired(n: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for i, pair in enumerate(_pairs(n, seed)):
        good = i % 2 == 0
        rows.append({"prompt": pair["prompt"], "completion": pair["chosen" if good else "rejected"], "label": good})
    return rows


def _train(run_dir: str, **changes: Any) -> dict[str, Any]:
    train = {"steps": STEPS, "batch_size": 4, "seq_len": 48, "run_dir": run_dir, "progress_bar": False,
             "tensorboard": False, "check_memory": False, "log_every": 1, "seed": 0, "mesh": {"num_devices": 1},
             "checkpoint": {"save_at_end": False, "async_save": False},
             "optimizer": {"learning_rate": 1e-2, "schedule": "constant", "weight_decay": 0.0}}
    train.update(changes)
    return train


def _model(tok: str) -> dict[str, Any]:
    return {"source": "preset:tiny-llama", "tokenizer": tok, "overrides": dict(SMALL)}


def raw_configs(workdir: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """name -> (training command, raw config) of every reference run, with its data written under `workdir`."""
    from tests.kit.tokenizers import tiny_chat_tokenizer

    tok = os.path.join(workdir, "tokenizer")
    if not os.path.isdir(tok):
        tiny_chat_tokenizer().hf.save_pretrained(tok)
    pairs = _write_jsonl(os.path.join(workdir, "pairs.jsonl"), _pairs(16, seed=0))
    unpaired = _write_jsonl(os.path.join(workdir, "unpaired.jsonl"), _unpaired(16, seed=0))
    chats = _write_jsonl(os.path.join(workdir, "chats.jsonl"), _chats(16))
    texts = _write_jsonl(os.path.join(workdir, "texts.jsonl"),
                         [{"text": " ".join(m["content"] for m in row["messages"])} for row in _chats(16)])
    hh = _write_jsonl(os.path.join(workdir, "hh.jsonl"), [
        {"chosen": f"\n\nHuman: {p['prompt']}\n\nAssistant: yes", "rejected": f"\n\nHuman: {p['prompt']}\n\nAssistant: no"}
        for p in _pairs(6, seed=2)])
    run = lambda name: os.path.join(workdir, name)  # noqa: E731
    return {
        "sft": ("sft", {"model": _model(tok), "data": {"path": chats, "packing": False},
                        "train": _train(run("sft"))}),
        "pretrain": ("pretrain", {"model": _model(tok), "data": {"path": texts, "text_fields": ["text"]},
                                  "train": _train(run("pretrain"))}),
        "dpo": ("dpo", {"model": _model(tok), "data": {"path": pairs, "eval_path": None},
                        "dpo": {"loss": "sigmoid", "beta": 0.1}, "train": _train(run("dpo"), batch_size=8)}),
        "kto": ("kto", {"model": _model(tok), "data": {"path": unpaired, "eval_path": None,
                                                       "convert_pairs": False},
                        "kto": {"beta": 0.1}, "train": _train(run("kto"), batch_size=8)}),
        "reward_model": ("reward-model", {"model": _model(tok), "data": {"path": pairs, "eval_path": None},
                                          "train": _train(run("reward_model"), batch_size=8)}),
        "grpo": ("grpo", {"model": _model(tok), "lora": {"rank": 2, "alpha": 4.0},
                          "task": {"name": "arithmetic", "num_train_problems": 8},
                          "grpo": {"group_size": 2, "max_new_tokens": 4, "beta": 0.04},
                          "rewards": {"functions": [f"model:{run('reward_model')}"]},
                          "eval": {"num_problems": 0}, "train": _without_seq_len(_train(run("grpo"), batch_size=2))}),
        # Every sample passes (length reward >= 0): the curve pins sampling, selection and the weighted SFT step.
        "rft": ("rft", {"model": _model(tok), "lora": {"rank": 2, "alpha": 4.0},
                        "task": {"name": "arithmetic", "num_train_problems": 8},
                        "rft": {"group_size": 2, "problems_per_round": 4, "sampling_batch": 4,
                                "max_new_tokens": 4, "threshold": 0.0, "keep_truncated": True},
                        "rewards": {"functions": ["length"]}, "eval": {"num_problems": 0},
                        "train": _train(run("rft"), batch_size=2, seq_len=224)}),
        "ppo": ("ppo", {"model": _model(tok), "reward_model": run("reward_model"),
                        "data": {"path": hh, "eval_path": hh},
                        "ppo": {"max_new_tokens": 4, "max_prompt_len": 64, "epochs": 1, "mini_batches": 2},
                        "eval": {"num_prompts": 2, "before": False, "after": False},
                        "train": _without_seq_len(_train(run("ppo"), batch_size=2))}),
        "distill": ("distill", {"teacher": {"source": "preset:tiny-llama", "tokenizer": tok,
                                            "overrides": dict(SMALL, num_layers=2)},
                                "student": {"source": "preset:tiny-llama", "tokenizer": tok, "overrides": dict(SMALL)},
                                "data": {"path": chats, "packing": False},
                                "loss": {"kind": "forward_kl", "alpha": 0.5, "chunk_len": 16},
                                "save_student": False, "train": _train(run("distill"), seq_len=32)}),
    }


def _without_seq_len(train: dict[str, Any]) -> dict[str, Any]:
    """On-policy runs size their sequences from the prompts and the generation budget."""
    train.pop("seq_len")
    return train


def is_trajectory_metric(key: str) -> bool:
    k = key.lower()
    return not any(word in k for word in MACHINE_WORDS)


def curves(history: list[tuple[int, dict[str, float]]]) -> dict[str, Any]:
    """{"steps": [...], "series": {metric: [value per step]}} of the trajectory metrics logged at every step."""
    steps = [s for s, _ in history]
    keys = sorted(set.intersection(*(set(m) for _, m in history))) if history else []
    series = {k: [float(m[k]) for _, m in history] for k in keys if is_trajectory_metric(k)}
    return {"steps": steps, "series": series}


def run_one(name: str, workdir: str, configs: dict[str, tuple[str, dict[str, Any]]] | None = None) -> dict[str, Any]:
    from tempax.algorithms.registry import resolve
    from tempax.configlib import from_dict

    configs = configs or raw_configs(workdir)
    command, raw = configs[name]
    cls, main = resolve(command)
    result = main(from_dict(cls, raw), log=lambda _: None)  # every main's RunResult: its logged history
    return curves(result.history)


def path_of(name: str) -> str:
    return os.path.join(HERE, f"{name}.json")


def write(name: str, curve: dict[str, Any]) -> str:
    """Store `curve` as this machine class's curve of `name`, keeping the other classes' curves."""
    import jax

    record = read(name) if os.path.exists(path_of(name)) else {"name": name, "curves": {}}
    record["curves"][cpu_model()] = {"jax": jax.__version__, **curve}
    with open(path_of(name), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    return path_of(name)


def read(name: str) -> dict[str, Any]:
    """{"name": ..., "curves": {machine class: {"jax", "steps", "series"}}} of a stored reference curve."""
    with open(path_of(name)) as f:
        return json.load(f)


# The order matters: GRPO and PPO score its rollouts with the reward model the reward_model run saved.
NAMES = ("sft", "pretrain", "dpo", "kto", "reward_model", "grpo", "rft", "ppo", "distill")
RunFn = Callable[[str, str], dict[str, Any]]
