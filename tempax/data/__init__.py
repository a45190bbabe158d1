"""The data layer: rows from files or the Hub -> tokens and loss masks -> fixed-shape, resumable batches.

  sources     read_rows / holdout_split: rows with their file and line
  formats     chat messages, prompt/completion and plain text -> `Example` (tokens + loss mask)
  preference  preference pairs and HH-RLHF dialogues -> `PreferencePair`, stacked [2B, T] batches
  packing     examples -> batch dicts (tokens, targets, loss_mask, positions, segment_ids)
  loader      `BatchLoader`: deterministic shuffling (Grain), epochs, `state()` / `restore()`
  report      `DataReport`: what was kept, skipped, dropped or truncated, and why
  kinds       what kind of row a dataset holds (chat, prompt/completion, preference, question/answer, text)
  clean       `tempax data clean`: normalise, filter, scrub PII, decontaminate, deduplicate (MinHash LSH)
  stats       `tempax data stats`: tokens, lengths, turns, loss-token share; `profile_dataset` for recommend
  tokenizer_train  byte-level BPE training, compression and round trip; adding tokens to a model
"""

from tempax.data.formats import Example, FormatOptions, encode_chat, load_examples, tokenize_rows
from tempax.data.loader import BatchLoader, sft_loader
from tempax.data.packing import BATCH_KEYS, collate_rows, pack_examples, pad_examples, plan_packing
from tempax.data.preference import (
    PreferenceOptions,
    PreferencePair,
    collate_pairs,
    load_preference_pairs,
    parse_hh_dialogue,
    preference_loader,
    tokenize_preference_rows,
)
from tempax.data.report import DataReport
from tempax.data.sources import Row, holdout_split, read_rows

__all__ = [
    "BATCH_KEYS",
    "BatchLoader",
    "DataReport",
    "Example",
    "FormatOptions",
    "PreferenceOptions",
    "PreferencePair",
    "Row",
    "collate_pairs",
    "collate_rows",
    "encode_chat",
    "holdout_split",
    "load_examples",
    "load_preference_pairs",
    "pack_examples",
    "pad_examples",
    "parse_hh_dialogue",
    "plan_packing",
    "preference_loader",
    "read_rows",
    "sft_loader",
    "tokenize_preference_rows",
    "tokenize_rows",
]
