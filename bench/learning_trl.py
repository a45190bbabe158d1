"""Learning as well as TRL: each recipe through tempax and through TRL's trainer, same start, data and budget.

    python bench/learning_trl.py --peer trl                      # every row on SmolLM2-135M-Instruct
    python bench/learning_trl.py --peer trl --only kto,dpo       # some rows; the others print "not run"
    python bench/learning_trl.py --peer trl --tiny --out DIR     # smoke: 2 steps a row on a tiny model
    python bench/learning_trl.py --table DIR                     # the table of runs already in DIR
    python bench/learning_trl.py --table DIR --record bench/records/learning.jsonl   # ... and onto docs/results.md

What is held equal, per row:
  * the starting weights: the Hugging Face folder `tempax export` writes (`base/` in the output folder; with
    --tiny, the tiny-llama preset and the test kit's tokenizer), which tempax trains from as `model.source` and
    TRL loads with `from_pretrained`, so both start bit-identical;
  * the rows, their tokens and their order: tempax's recipe tokenises the data (`build_unpaired_data` /
    `build_preference_data`, with its truncation) and its loader fixes the order (`epoch_order`); TRL gets those
    token ids pre-tokenised in that order (its `_prepare_dataset` is bypassed, `train_sampling_strategy` is
    sequential), and for KTO the same mismatched rows for the KL reference point;
  * the LoRA adapters' initial weights (tempax's, seeded, read into PEFT: `initial_adapters`), so rank / alpha /
    target modules match by construction (dropout 0); AdamW (betas, eps, weight decay, clipping at 1.0), the
    learning rate of every update (tempax's warm-up and cosine schedule, step for step: `lr_factors`), the batch
    (in examples), the steps, beta / the KTO weights, the seed, the reference (the base with adapters switched off
    on both sides);
  * the evaluation, by tempax's code, on both final models: TRL's adapter is read back through the PEFT round trip
    (`tempax.models.lora.load_adapters`), tempax's is exported in the same layout (`tempax export RUN --adapters`).

Rows and their metric: DPO and KTO, preference accuracy of the implicit rewards beta (log pi - log ref) on the
held-out pairs (>= 200 in the full run). SFT, the reward model and GRPO on the arithmetic task are listed; their TRL
side is not built yet, so they print "not run". For each row: metric before -> after for both, the paired
difference tempax - TRL with Newcombe's 95% interval for paired proportions (`tempax.eval.metrics`), the wall and
CPU seconds (user + system of the training process) of each side, the versions of both libraries and the CPU.

Each side trains in its own child process: tempax's command (without its own held-out evaluation), and TRL's
trainer in a process that imports no JAX (`--side trl`), after a preparation child (`--prepare`, not counted in
TRL's budget) has written tempax's tokens, order and initial adapters for it. The evaluation runs in a third
(`--evaluate`). The last column, each side's last training loss, checks that the two runs are one run: from the
same start on the same rows they agree closely for the first steps. Files: OUT/NAME/{tempax,trl}/adapters,
OUT/NAME/{tempax,trl}.budget.json, OUT/NAME/outcomes.json (per-pair outcomes and per-step training losses).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.learning import _percent, _points, cpu_name  # noqa: E402  (the learning table's formatting)
from tempax.eval.metrics import paired_difference_interval  # noqa: E402

SIDES = ("tempax", "trl")
# --tiny: the test kit's tiny-llama shape (one layer, the kit tokenizer's 400 ids), 2 steps of 2 examples.
TINY_MODEL = {"vocab_size": 400, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "num_kv_heads": 1,
              "head_dim": 16, "intermediate_size": 64}
TINY_OVERRIDES = ("train.steps=2", "train.batch_size=4", "train.seq_len=64", "data.max_rows=8",
                  "data.max_eval_rows=6", "train.optimizer.warmup_steps=0")


@dataclass(frozen=True)
class PeerRow:
    """A learning-table row run by both libraries: tempax's `COMMAND --config RECIPE`, and TRL's trainer on the
    rows `trl_rows` gives (None: not built yet, the row prints "not run")."""

    name: str
    command: str
    recipe: str
    overrides: tuple[str, ...] = ()
    trl_rows: Callable[..., tuple[list[dict], dict[str, Any]]] | None = None
    trl_trainer: str = ""  # TRL's trainer and config class prefix: "KTO" -> trl.KTOTrainer, trl.KTOConfig
    missing: str = ""  # why the row has no TRL side yet


# Preference rows score 200 held-out hh-rlhf pairs, as in bench/learning.py.
_PAIRS = ("data.max_eval_rows=200",)


# ------------------------------------------------------------------------------------------------ the shared base


def write_base(folder: str, *, tiny: bool) -> str:
    """The starting Hugging Face folder both sides train from (`tempax export`'s writer)."""
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    if tiny:
        from flax import nnx

        from tempax.models.decoder import Decoder
        from tempax.models.hf_io import save_hf_checkpoint
        from tempax.models.presets import PRESETS
        from tests.kit.tokenizers import tiny_chat_tokenizer

        model = Decoder(PRESETS["tiny-llama"].replace(**TINY_MODEL), rngs=nnx.Rngs(0))
        save_hf_checkpoint(model, folder, tokenizer=tiny_chat_tokenizer())
        return folder
    subprocess.run([sys.executable, "-m", "tempax.cli.main", "export", "smollm2-135m-instruct", folder], cwd=REPO,
                   check=True, env=_env())
    return folder


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}


def _overrides(row: PeerRow, base: str, tiny: bool, extra: tuple[str, ...]) -> list[str]:
    return [f"model.source={base}", "train.progress_bar=false", *row.overrides,
            *(TINY_OVERRIDES if tiny else ()), *extra]


# ------------------------------------------------------------------------------------------------ the TRL side


def _split(example: Any) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of a tokenised example: the completion runs from the first to the last trained
    token (tokens after it are predicted by nothing trained and change no trained log-prob)."""
    mask = [bool(m) for m in example.loss_mask]
    first = mask.index(True)
    last = len(mask) - 1 - mask[::-1].index(True)
    ids = [int(t) for t in example.tokens]
    return ids[:first], ids[first : last + 1]


def _ordered(cfg: Any, items: list[Any], per_batch: int) -> list[Any]:
    """The items in the order tempax's loader visits them over cfg.train.steps batches."""
    from tempax.algorithms.preference.batches import annotated_pair_loader

    loader = annotated_pair_loader(items, batch_size=per_batch, seq_len=cfg.train.seq_len, pad_id=0,
                                   seed=cfg.train.seed, shuffle=cfg.data.shuffle)
    order: list[Any] = []
    epoch = 0
    while len(order) < cfg.train.steps * per_batch:
        visit = [items[i] for i in loader.epoch_order(epoch)]
        order.extend(visit[: len(visit) - len(visit) % per_batch])  # tempax drops a short final batch
        epoch += 1
    return order[: cfg.train.steps * per_batch]


def trl_arguments(cfg: Any, **extra: Any) -> dict[str, Any]:
    """TRL's config fields (a `KTOConfig` / `DPOConfig`) with tempax's optimisation settings (`cfg.train`) and
    precision."""
    t, opt = cfg.train, cfg.train.optimizer
    if opt.name != "adamw" or opt.min_lr_ratio or opt.schedule != "cosine":
        raise SystemExit("bench/learning_trl.py maps AdamW with a cosine schedule to 0 only")
    return dict(
        per_device_train_batch_size=t.batch_size // 2, gradient_accumulation_steps=1, max_steps=t.steps,
        learning_rate=opt.learning_rate, lr_scheduler_type="cosine", warmup_steps=opt.warmup_steps,
        weight_decay=opt.weight_decay, adam_beta1=opt.b1, adam_beta2=opt.b2, adam_epsilon=opt.eps,
        max_grad_norm=opt.grad_clip_norm or 0.0, seed=t.seed, data_seed=t.seed, train_sampling_strategy="sequential",
        max_length=None, report_to=[], logging_steps=1, save_strategy="no", use_cpu=True, dataloader_num_workers=0,
        disable_dropout=True,
        # TRL's configs default to bf16 autocast; tempax's precision decides (fp32: float32 throughout; bf16:
        # bfloat16 matmuls over float32 master weights, which is what autocast does).
        bf16=t.precision == "bf16", fp16=False, **extra)


def initial_adapters(cfg: Any, out: str) -> str:
    """The LoRA adapters tempax's run starts from (A drawn from seed train.seed + 1, B = 0), in PEFT layout, so
    TRL starts from the same adapter weights as well as the same base."""
    from tempax.algorithms.common import build_model
    from tempax.models.lora import save_adapters

    if cfg.lora is None or cfg.lora.dropout:
        raise SystemExit("bench/learning_trl.py compares LoRA runs without adapter dropout")
    model, _, _ = build_model(cfg)
    return save_adapters(model, os.path.join(out, "initial_adapters"))


def kto_rows(cfg: Any, base: str) -> tuple[list[dict], dict[str, Any]]:
    """KTOTrainer's rows (each with tempax's mismatched row as its KL completion) and its arguments."""
    from tempax.algorithms.preference.data import build_unpaired_data
    from tempax.algorithms.preference.kto import DESIRABLE, kto_items
    from tempax.models.registry import load_tokenizer

    data = build_unpaired_data(cfg.data, load_tokenizer(base), seq_len=cfg.train.seq_len, seed=cfg.train.seed)
    rows = []
    # kto_items: the stacked-batch items tempax's KTO loader shuffles (completion first, mismatched row second).
    for item in _ordered(cfg, kto_items(list(data.train)), cfg.train.batch_size // 2):
        prompt, completion = _split(item.chosen)
        kl_prompt, kl_completion = _split(item.rejected)
        assert kl_prompt == prompt, item.source  # the mismatched row shares the prompt tokens
        rows.append({"prompt_ids": prompt, "completion_ids": completion, "KL_completion_ids": kl_completion,
                     "label": item.values[DESIRABLE][0] > 0})
    return rows, trl_arguments(cfg, beta=cfg.kto.beta, desirable_weight=cfg.kto.desirable_weight,
                               undesirable_weight=cfg.kto.undesirable_weight)


def dpo_rows(cfg: Any, base: str) -> tuple[list[dict], dict[str, Any]]:
    """DPOTrainer's rows (sigmoid loss) and its arguments."""
    from tempax.algorithms.preference.data import build_preference_data
    from tempax.models.registry import load_tokenizer

    if cfg.dpo.loss != "sigmoid" or cfg.dpo.label_smoothing:
        raise SystemExit("bench/learning_trl.py maps dpo.loss=sigmoid without label smoothing only")
    data = build_preference_data(cfg.data, load_tokenizer(base), seq_len=cfg.train.seq_len, seed=cfg.train.seed)
    rows = []
    for pair in _ordered(cfg, list(data.train), cfg.train.batch_size // 2):
        prompt, chosen = _split(pair.chosen)
        rejected_prompt, rejected = _split(pair.rejected)
        assert rejected_prompt == prompt, pair.source
        rows.append({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
    return rows, trl_arguments(cfg, beta=cfg.dpo.beta, loss_type=["sigmoid"])


def prepare_trl(row: "PeerRow", cfg: Any, base: str, out: str) -> None:
    """Writes what TRL's child trains on (tempax's tokens in tempax's order, its arguments, tempax's initial
    adapters) to `out`, so the TRL child imports no JAX and its budget is TRL's own."""
    rows, arguments = row.trl_rows(cfg, base)
    os.makedirs(out, exist_ok=True)
    initial_adapters(cfg, out)
    with open(os.path.join(out, "trl_inputs.json"), "w") as f:
        json.dump({"rows": rows, "arguments": arguments, "lr_factors": lr_factors(cfg)}, f)


def lr_factors(cfg: Any) -> list[float]:
    """tempax's learning rate of each update as a fraction of the peak (`tempax.train.optim.make_schedule`), which
    TRL's side follows step for step: transformers' own warm-up gives the first update a rate of 0 and runs one step
    behind tempax's through the warm-up, so its "cosine" is not the same schedule."""
    from tempax.train.optim import make_schedule

    schedule = make_schedule(cfg.train.optimizer, cfg.train.steps)
    return [float(schedule(k)) / cfg.train.optimizer.learning_rate for k in range(cfg.train.steps)]


def train_trl(row: "PeerRow", base: str, out: str) -> None:
    """TRL's trainer on the prepared rows, in their order, from the prepared adapters; writes its adapter (PEFT
    layout) and its log history."""
    import datasets
    import peft
    import torch
    import transformers
    import trl

    trainer_cls, config_cls = getattr(trl, row.trl_trainer + "Trainer"), getattr(trl, row.trl_trainer + "Config")

    with open(os.path.join(out, "trl_inputs.json")) as f:
        inputs = json.load(f)
    factors = inputs["lr_factors"]

    class PreTokenised(trainer_cls):  # the rows are tempax's tokens already: no re-tokenising, no re-pairing
        def _prepare_dataset(self, dataset, *unused, **unused_kw):
            return dataset

        def create_scheduler(self, num_training_steps, optimizer=None):  # tempax's rate for each update
            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer or self.optimizer, lambda k: factors[min(k, len(factors) - 1)])
            return self.lr_scheduler

    policy = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base, dtype="float32"),
                                            os.path.join(out, "initial_adapters"), is_trainable=True)
    trainer = PreTokenised(model=policy, args=config_cls(output_dir=out, **inputs["arguments"]),
                           train_dataset=datasets.Dataset.from_list(inputs["rows"]),
                           processing_class=transformers.AutoTokenizer.from_pretrained(base))
    trainer.train()
    trainer.model.save_pretrained(os.path.join(out, "adapters"))
    with open(os.path.join(out, "log_history.json"), "w") as f:
        json.dump(trainer.state.log_history, f)


ROWS = (
    PeerRow("SFT", "sft", "recipes/sft_lora_smollm2.yaml", missing="the TRL side (SFTTrainer) is not built yet"),
    PeerRow("DPO", "dpo", "recipes/dpo_smollm2_lora.yaml", _PAIRS, dpo_rows, "DPO"),
    PeerRow("KTO", "kto", "recipes/kto_smollm2_lora.yaml", _PAIRS, kto_rows, "KTO"),
    PeerRow("reward model", "reward-model", "recipes/reward_model_smollm2_lora.yaml",
            missing="the TRL side (RewardTrainer) is not built yet"),
    PeerRow("GRPO, arithmetic", "grpo", "", missing="the TRL side (GRPOTrainer on the demo's task) is not built yet"),
)


def _config_class(command: str) -> Any:
    from tempax.algorithms.preference.dpo import DPOConfig
    from tempax.algorithms.preference.kto import KTOConfig

    return {"dpo": DPOConfig, "kto": KTOConfig}[command]


def load_row_config(row: PeerRow, overrides: list[str]) -> Any:
    from tempax.configlib import load_config

    return load_config(_config_class(row.command), os.path.join(REPO, row.recipe), overrides, command=row.command)


# ------------------------------------------------------------------------------------------------ evaluation


def pair_outcomes(cfg: Any, base: str, adapters: str | None) -> list[bool]:
    """Per held-out pair: does the adapted model's implicit reward beta (log pi - log ref) rank the chosen reply
    above the rejected one (ref: the same model with its adapters off; no adapters: every reward is 0, a tie,
    counted wrong)? tempax's scoring of the held-out pairs, as its DPO and KTO runs evaluate."""
    import numpy as np

    from tempax.algorithms.preference.batches import jit_sequence_logps, pair_batches
    from tempax.algorithms.preference.data import build_preference_data
    from tempax.models.lora import load_adapters
    from tempax.models.registry import load

    model, tokenizer = load(base)
    data = build_preference_data(cfg.data, tokenizer, seq_len=cfg.train.seq_len, seed=cfg.train.seed)
    if adapters is None:
        return [False] * len(data.eval)
    model = load_adapters(model, adapters)
    policy, reference = jit_sequence_logps(model), jit_sequence_logps(model, adapters_off=True)
    per_batch = max(cfg.train.batch_size // 2, 1)
    correct: list[bool] = []
    for batch in pair_batches(data.eval, batch_size=per_batch, seq_len=cfg.train.seq_len, pad_id=tokenizer.pad_id):
        ratio = np.asarray(policy(batch)[0]) - np.asarray(reference(batch)[0])
        chosen, rejected = ratio[:per_batch], ratio[per_batch:]
        correct.extend(bool(c > r) for c, r in zip(chosen, rejected))
    return correct[: len(data.eval)]


def evaluate_row(row: PeerRow, row_dir: str, overrides: list[str]) -> dict[str, Any]:
    cfg = load_row_config(row, overrides)
    base = _base_of(overrides)
    result: dict[str, Any] = {"before": pair_outcomes(cfg, base, None)}
    for side in SIDES:
        folder = os.path.join(row_dir, side, "adapters")
        if os.path.isdir(folder):
            result[side] = pair_outcomes(cfg, base, folder)
    result["train_loss"] = training_losses(row_dir)
    return result


def training_losses(row_dir: str) -> dict[str, list[float]]:
    """Each side's training loss per step: tempax's metrics.jsonl, TRL's log history (same start, same rows and
    the same optimiser: the first steps agree closely, a check that the two runs are the same run)."""
    losses: dict[str, list[float]] = {}
    try:
        with open(os.path.join(row_dir, "tempax", "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        losses["tempax"] = [float(r["loss"]) for r in records if "loss" in r and "step" in r]
    except OSError:
        pass
    try:
        with open(os.path.join(row_dir, "trl", "log_history.json")) as f:
            losses["trl"] = [float(r["loss"]) for r in json.load(f) if "loss" in r]
    except OSError:
        pass
    return losses


# ------------------------------------------------------------------------------------------------ running a row


def _timed(cmd: list[str], log_path: str) -> tuple[int, float, float]:
    """(exit status, wall s, CPU s: user + system of the child) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        code = subprocess.run(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return code, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_row(row: PeerRow, out: str, base: str, tiny: bool, extra: tuple[str, ...]) -> None:
    """Trains both sides of `row` in child processes, exports tempax's adapter, evaluates both."""
    row_dir = os.path.join(out, row_slug(row))
    os.makedirs(row_dir, exist_ok=True)
    overrides = _overrides(row, base, tiny, extra)
    for side in SIDES:
        side_dir = os.path.join(row_dir, side)
        if side == "tempax":  # scored by the evaluation child below, not by the training run itself
            cmd = [sys.executable, "-m", "tempax.cli.main", row.command, "--config", row.recipe,
                   f"train.run_dir={side_dir}", *overrides, "eval_before=false", "data.eval_path=null"]
        else:
            prepare = [sys.executable, os.path.abspath(__file__), "--prepare", row.name, "--run", side_dir, "--",
                       *overrides]
            if _timed(prepare, side_dir + ".prepare.log")[0]:
                print(f"{row.name}: preparing TRL's rows failed, see {side_dir}.prepare.log", file=sys.stderr)
            cmd = [sys.executable, os.path.abspath(__file__), "--side", "trl", "--row", row.name, "--run", side_dir,
                   "--", *overrides]
        code, wall, cpu = _timed(cmd, side_dir + ".log")
        if code == 0 and side == "tempax":
            code = subprocess.run([sys.executable, "-m", "tempax.cli.main", "export", side_dir,
                                   os.path.join(side_dir, "adapters"), "--adapters"], cwd=REPO, env=_env(),
                                  capture_output=True).returncode
        with open(side_dir + ".budget.json", "w") as f:
            json.dump({"wall_s": wall, "cpu_s": cpu, "exit": code}, f)
    code, _, _ = _timed([sys.executable, os.path.abspath(__file__), "--evaluate", row.name, "--run", row_dir, "--",
                         *overrides], os.path.join(row_dir, "evaluate.log"))
    if code:
        print(f"{row.name}: evaluation failed, see {row_dir}/evaluate.log", file=sys.stderr)


def row_slug(row: PeerRow) -> str:
    return row.name.split(",")[0].replace(" ", "_")


# ------------------------------------------------------------------------------------------------ the table


def versions() -> str:
    """The library versions of both sides."""
    names = ("tempax", "jax", "flax", "trl", "transformers", "torch", "peft")
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return ", ".join(found)


def _budget_of(row_dir: str, side: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(row_dir, side + ".budget.json")) as f:
            return json.load(f)
    except OSError:
        return None


def _seconds(spent: dict[str, Any] | None) -> str:
    return f"{spent['wall_s']:.0f} / {spent['cpu_s']:.0f}" if spent else "-"


def table_line(row: PeerRow, out: str) -> str:
    """One Markdown line: the row's before -> after for both sides, tempax - TRL, and both budgets."""
    row_dir = os.path.join(out, row_slug(row))
    if row.trl_rows is None:
        return f"| {row.name} | not run ({row.missing}) | - | - | - | - | - |"
    try:
        with open(os.path.join(row_dir, "outcomes.json")) as f:
            outcomes = json.load(f)
    except OSError:
        return f"| {row.name} | not run | - | - | - | - | - |"
    budgets = {side: _budget_of(row_dir, side) for side in SIDES}
    cells = []
    for side in SIDES:
        after = outcomes.get(side)
        if after is None:
            spent = budgets[side]
            cells.append(f"failed (exit {spent['exit']})" if spent and spent.get("exit") else "not run")
        else:
            cells.append(f"a tie -> {_percent((sum(after), len(after)))}")
    if "tempax" in outcomes and "trl" in outcomes:
        d = paired_difference_interval(outcomes["tempax"], outcomes["trl"])
        difference = _points(d.difference, d.low, d.high) + ", paired"
    else:
        difference = "-"
    losses = outcomes.get("train_loss", {})
    last = " / ".join(f"{losses[side][-1]:.4f}" if losses.get(side) else "-" for side in SIDES)
    return (f"| {row.name} | preference accuracy, tempax: {cells[0]} | TRL: {cells[1]} | {difference} | "
            f"{_seconds(budgets['tempax'])} | {_seconds(budgets['trl'])} | {last} |")


def table(rows: tuple[PeerRow, ...], out: str, cpu: str) -> str:
    lines = [f"tempax against TRL, same start, rows, order and budget ({cpu}; {versions()}; 95% intervals):", "",
             "| row | tempax: before -> after | TRL: before -> after | tempax - TRL, 95% interval | "
             "tempax wall / CPU s | TRL wall / CPU s | last training loss, tempax / TRL |",
             "|---|---|---|---|---|---|---|"]
    lines += [table_line(row, out) for row in rows]
    return "\n".join(lines)


def table_record(rows: tuple[PeerRow, ...], out: str, cpu: str, command: str) -> dict[str, Any]:
    """The table as a `bench/results.py` record (topic "learning"), the rows that were run only."""
    lines = table(rows, out, cpu).splitlines()
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]
    run = [row for row in cells[2:] if row[1] != "not run" and not row[1].startswith("not run (")]
    return {"kind": "table", "topic": "learning", "title": "tempax against TRL: same start, rows, order and budget",
            "columns": cells[0], "rows": run, "command": command, "cpu": cpu, "notes": versions()}


def selected(only: str | None) -> list[PeerRow]:
    if not only:
        return [r for r in ROWS if r.trl_rows is not None]
    names = {n.strip().lower() for n in only.split(",")}
    return [r for r in ROWS if r.trl_rows is not None and (r.name.lower() in names or r.command in names)]


def _base_of(overrides: list[str]) -> str:
    """The starting folder: the `model.source=` override every child gets first."""
    return overrides[0].split("=", 1)[1]


def _row_named(name: str) -> PeerRow:
    return next(r for r in ROWS if r.name == name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=("trl",), default="trl", help="the library compared with (TRL, pinned)")
    parser.add_argument("--only", default=None, help="comma-separated row names or commands (default: every row "
                        "whose TRL side exists)")
    parser.add_argument("--out", default="runs/learning_trl", help="where the runs go")
    parser.add_argument("--tiny", action="store_true", help="smoke mode: a tiny model, 2 steps a row")
    parser.add_argument("--table", default=None, metavar="OUT", help="print the table of the runs in OUT, run nothing")
    parser.add_argument("--record", default=None, metavar="FILE", help="also append the table, rows that ran, as a "
                        "bench/results.py record to FILE (e.g. bench/records/learning.jsonl)")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--evaluate", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prepare", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--row", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run", default=None, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="a.b=value overrides for both sides (after --)")
    args = parser.parse_args(argv)
    if args.prepare:  # a child: tempax's tokens, order and initial adapters for TRL's side of one row
        row = _row_named(args.prepare)
        prepare_trl(row, load_row_config(row, args.overrides), _base_of(args.overrides), args.run)
        return 0
    if args.side == "trl":  # a child: TRL's side of one row (torch and TRL only)
        train_trl(_row_named(args.row), _base_of(args.overrides), args.run)
        return 0
    if args.evaluate:  # a child: both final models of one row, scored by tempax
        outcomes = evaluate_row(_row_named(args.evaluate), args.run, args.overrides)
        with open(os.path.join(args.run, "outcomes.json"), "w") as f:
            json.dump(outcomes, f)
        return 0
    out = args.table or args.out
    if not args.table:
        os.makedirs(out, exist_ok=True)
        base = write_base(os.path.abspath(os.path.join(out, "base")), tiny=args.tiny)
        for row in selected(args.only):
            print(f"running {row.name}: tempax {row.command} and TRL", file=sys.stderr, flush=True)
            run_row(row, out, base, args.tiny, tuple(args.overrides))
    print(table(ROWS, out, cpu_name()))
    if args.record:
        command = "python bench/learning_trl.py --peer trl" + (f" --only {args.only}" if args.only else "")
        with open(args.record, "a", encoding="utf-8") as f:
            f.write(json.dumps(table_record(ROWS, out, cpu_name(), command)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
