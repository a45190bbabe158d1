"""DPO and KTO: tempax's tokenised pairs (and unpaired rows with their mismatched KL rows) for TRL's DPOTrainer
and KTOTrainer, and the rows' metric, the implicit-reward preference accuracy on the held-out pairs."""

from __future__ import annotations

from typing import Any

from bench.trl_sides.common import TrlSide, ordered, side_outcomes, trl_arguments


def split_completion(example: Any) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of a tokenised example: the completion runs from the first to the last trained
    token (tokens after it are predicted by nothing trained and change no trained log-prob)."""
    mask = [bool(m) for m in example.loss_mask]
    first = mask.index(True)
    last = len(mask) - 1 - mask[::-1].index(True)
    ids = [int(t) for t in example.tokens]
    return ids[:first], ids[first : last + 1]


def kto_rows(cfg: Any, base: str) -> tuple[list[dict], dict[str, Any]]:
    """KTOTrainer's rows (each with tempax's mismatched row as its KL completion) and its arguments."""
    from tempax.algorithms.preference.data import build_unpaired_data
    from tempax.algorithms.preference.kto import DESIRABLE, kto_items
    from tempax.models.registry import load_tokenizer

    data = build_unpaired_data(cfg.data, load_tokenizer(base), seq_len=cfg.train.seq_len, seed=cfg.train.seed)
    rows = []
    # kto_items: the stacked-batch items tempax's KTO loader shuffles (completion first, mismatched row second).
    for item in ordered(cfg, kto_items(list(data.train)), cfg.train.batch_size // 2):
        prompt, completion = split_completion(item.chosen)
        kl_prompt, kl_completion = split_completion(item.rejected)
        assert kl_prompt == prompt, item.source  # the mismatched row shares the prompt tokens
        rows.append({"prompt_ids": prompt, "completion_ids": completion, "KL_completion_ids": kl_completion,
                     "label": item.values[DESIRABLE][0] > 0})
    return rows, trl_arguments(cfg, cfg.train.batch_size // 2, max_length=None, disable_dropout=True,
                               beta=cfg.kto.beta, desirable_weight=cfg.kto.desirable_weight,
                               undesirable_weight=cfg.kto.undesirable_weight)


def dpo_rows(cfg: Any, base: str) -> tuple[list[dict], dict[str, Any]]:
    """DPOTrainer's rows (sigmoid loss) and its arguments."""
    from tempax.algorithms.preference.data import build_preference_data
    from tempax.models.registry import load_tokenizer

    if cfg.dpo.loss != "sigmoid" or cfg.dpo.label_smoothing:
        raise SystemExit("bench/learning_trl.py maps dpo.loss=sigmoid without label smoothing only")
    data = build_preference_data(cfg.data, load_tokenizer(base), seq_len=cfg.train.seq_len, seed=cfg.train.seed)
    rows = []
    for pair in ordered(cfg, list(data.train), cfg.train.batch_size // 2):
        prompt, chosen = split_completion(pair.chosen)
        rejected_prompt, rejected = split_completion(pair.rejected)
        assert rejected_prompt == prompt, pair.source
        rows.append({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
    return rows, trl_arguments(cfg, cfg.train.batch_size // 2, max_length=None, disable_dropout=True,
                               beta=cfg.dpo.beta, loss_type=["sigmoid"])


DPO_SIDE = TrlSide("DPO", dpo_rows)
KTO_SIDE = TrlSide("KTO", kto_rows)


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


def evaluate_implicit_rewards(cfg: Any, base: str, row_dir: str) -> dict[str, list[bool]]:
    """Per-pair outcomes before training (a tie: the policy is the reference) and of each side's final adapters."""
    return side_outcomes(pair_outcomes, cfg, base, row_dir)
