"""SFT: tempax's packed rows for TRL's SFTTrainer, and the row's metric, each held-out example's mean token loss.

tempax packs examples into [batch_size, seq_len] rows (`tempax.data.packing`): segment ids keep attention inside
each example, positions restart at 0 in each, and the loss is the mean over the assistant tokens of the whole
batch. TRL gets those rows as they are, in the same order, each as its tokens without the trailing padding, its
labels (a token where tempax trains its prediction, -100 elsewhere) and the lengths of the examples packed in it
(`seq_lengths`, from which TRL's collator builds per-example position ids restarting at 0). That is TRL's own
packed layout (`padding_free=True`, what `packing=True` gives it): the collator concatenates a step's rows into one
sequence with no attention mask, and transformers' masking (`masking_utils.find_packed_sequence_indices`, used by
the sdpa and eager masks when the attention mask is None and there is no cache) starts a new example wherever the
position ids do not step by 1, so no token attends across an example boundary, as in tempax.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

from bench.trl_sides.common import SIDES, TrlSide, trl_arguments

ROWS_FOLDER = "rows"  # ROW/rows/{train,held_out}.jsonl: the recipe's rows, split once for both sides


def split_rows(cfg: Any, row_dir: str) -> list[str]:
    """Splits the recipe's rows once as tempax's SFT run would (the first data.max_rows, then `holdout_split` of
    data.eval_fraction seeded by train.seed) into ROW/rows/train.jsonl and held_out.jsonl, and returns the
    overrides that train both sides on the training file with no held-out split of their own. Neither run then
    evaluates (tempax's would score held-out batches at its end, inside its timed budget); the held-out examples
    are scored afterwards, by one code, on both final models."""
    from tempax.data.sft import read_data_rows
    from tempax.data.sources import holdout_split

    if not cfg.data.eval_fraction > 0:
        raise SystemExit("the SFT row scores held-out examples: set data.eval_fraction > 0")
    rows = read_data_rows(cfg.data)
    if cfg.data.max_rows is not None:
        rows = rows[: cfg.data.max_rows]
    train, held_out = holdout_split(rows, cfg.data.eval_fraction, seed=cfg.train.seed)
    folder = os.path.join(row_dir, ROWS_FOLDER)
    os.makedirs(folder, exist_ok=True)
    for name, part in (("train", train), ("held_out", held_out)):
        with open(os.path.join(folder, name + ".jsonl"), "w", encoding="utf-8") as f:
            # A malformed row (no data) is one tempax's run would skip and report: it is left out here.
            f.writelines(json.dumps(r.data) + "\n" for r in part if r.data is not None)
    return [f"data.path={os.path.join(folder, 'train.jsonl')}", "data.max_rows=null", "data.eval_fraction=0"]


def packed_row(batch: dict[str, Any], r: int) -> dict[str, list[int]]:
    """Row `r` of a tempax packed batch as an SFTTrainer dataset row: `input_ids` (the row's tokens up to its
    trailing padding), `labels` (labels[j] = tokens[j] where tempax trains the prediction of token j from the
    tokens before it, i.e. loss_mask[j - 1] = 1; -100 elsewhere, and always at an example's first token) and
    `seq_lengths` (the tokens of each example packed in the row, in order)."""
    import numpy as np

    segments = np.asarray(batch["segment_ids"][r])
    n = int(np.count_nonzero(segments))
    if n == 0 or np.any(segments[n:]):
        raise SystemExit(f"packed row {r} is empty or not padded at its end only")
    tokens, mask = np.asarray(batch["tokens"][r, :n]), np.asarray(batch["loss_mask"][r, :n])
    lengths = np.bincount(segments[:n])[1:]
    # The position ids TRL's collator derives from seq_lengths are tempax's positions.
    assert np.array_equal(np.concatenate([np.arange(k) for k in lengths]), batch["positions"][r, :n]), r
    # An example's last slot predicts nothing (its next token is another example's or padding), so the label of
    # every example's first token below is -100.
    assert not mask[np.cumsum(lengths) - 1].any(), r
    labels = [-100] + [int(t) if m else -100 for t, m in zip(tokens[1:], mask[:-1])]
    return {"input_ids": tokens.tolist(), "labels": labels, "seq_lengths": lengths.tolist()}


def sft_rows(cfg: Any, base: str) -> tuple[list[dict], dict[str, Any]]:
    """SFTTrainer's rows: the cfg.train.steps batches of packed rows tempax's loader gives, in order, and its
    arguments (a step is cfg.train.batch_size packed rows, as tempax's)."""
    from tempax.data.sft import build_data
    from tempax.models.registry import load_tokenizer

    if cfg.loss.normalize != "tokens":
        raise SystemExit("bench/learning_trl.py maps SFT's loss.normalize=tokens (TRL's token mean) only")
    t = cfg.train
    data = build_data(cfg.data, load_tokenizer(base), batch_size=t.batch_size, seq_len=t.seq_len, seed=t.seed)
    rows = [packed_row(batch, r) for batch in itertools.islice(data.train, t.steps) for r in range(t.batch_size)]
    return rows, trl_arguments(cfg, t.batch_size, max_length=None, packing=False, padding_free=True)


SFT_SIDE = TrlSide("SFT", sft_rows)


def held_out_examples(cfg: Any, tokenizer: Any, row_dir: str) -> list[Any]:
    """The held-out rows `split_rows` wrote, tokenised as tempax's SFT run tokenises its held-out rows."""
    from tempax.data.sft import build_data
    from tempax.data.sources import read_rows

    held_out = read_rows(os.path.join(row_dir, ROWS_FOLDER, "held_out.jsonl"))
    t = cfg.train
    data = build_data(cfg.data, tokenizer, batch_size=t.batch_size, seq_len=t.seq_len, seed=t.seed,
                      eval_rows=held_out)
    return data.eval_examples


def example_losses(cfg: Any, model: Any, examples: list[Any], pad_id: int) -> list[float]:
    """Each example's mean next-token loss over its trained (assistant) tokens, in nats, under `model`: one example
    a row, scored by tempax's `causal_lm_loss`; examples without a trained token are left out."""
    import jax
    import numpy as np
    from flax import nnx

    from tempax.algorithms.sft.losses import causal_lm_loss
    from tempax.data.loader import sft_loader

    graphdef, state = nnx.split(model)

    @jax.jit
    def per_example(state: Any, batch: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
        m = nnx.merge(graphdef, state)
        logits, _ = m(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"])
        _, metrics = causal_lm_loss(logits, batch["targets"], batch["loss_mask"])
        return metrics["per_example_loss"], batch["loss_mask"].sum(axis=-1)

    losses: list[float] = []
    for batch in sft_loader(examples, batch_size=cfg.train.batch_size, seq_len=cfg.train.seq_len, pad_id=pad_id,
                            packing=False, shuffle=False, num_epochs=1, drop_remainder=False):
        loss, tokens = per_example(state, batch)
        losses.extend(float(x) for x, n in zip(np.asarray(loss), np.asarray(tokens)) if n > 0)
    return losses


def evaluate_held_out_loss(cfg: Any, base: str, row_dir: str) -> dict[str, list[float]]:
    """Per held-out example, its mean token loss under the starting model ("before", the same for both sides) and
    under each side's final adapters (read back through the PEFT round trip)."""
    from tempax.models.lora import load_adapters
    from tempax.models.registry import load

    model, tokenizer = load(base)
    examples = held_out_examples(cfg, tokenizer, row_dir)
    result = {"before": example_losses(cfg, model, examples, tokenizer.pad_id)}
    for side in SIDES:
        folder = os.path.join(row_dir, side, "adapters")
        if os.path.isdir(folder):
            result[side] = example_losses(cfg, load_adapters(load(base)[0], folder), examples, tokenizer.pad_id)
    return result
