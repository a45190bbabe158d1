"""`tempax data clean`: normalise, filter, scrub, decontaminate and deduplicate a dataset, one row at a time.

    cfg = load_config(CleanConfig, "examples/clean_sft.yaml", ["near_dedup.threshold=0.8"])
    report = clean_file("in.jsonl", "out.jsonl", cfg)
    print(report.table())

Rows stream from the input to the output file; the first step that rejects a row names the reason it is dropped,
and the report counts every reason (`clean_rows` lists the steps, what each drops and what memory they hold).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import time
import unicodedata
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Literal

import numpy as np

from tempax.configlib import help_field, to_dict
from tempax.data import reasons
from tempax.data.kinds import content_strings, map_content, mixed_kinds_error, row_kind
from tempax.data.sources import Row, iter_rows
from tempax.errors import ConfigError, DataError
from tempax.progress import work_bar

# --------------------------------------------------------------------------------------------------------------
# Pure text functions (each tested in tests/data/test_clean.py)

_SPACES = re.compile(r"[^\S\n]+")  # runs of whitespace other than newlines
_MANY_NEWLINES = re.compile(r"\n{3,}")
_WORD = re.compile(r"\w+", re.UNICODE)


def normalize_text(text: str, *, form: str | None = "NFC", whitespace: bool = True) -> str:
    """Unicode normal form `form` (None: unchanged), then with `whitespace`: CRLF / CR -> LF, every other run of
    whitespace inside a line (tabs, no-break and zero-width-free spaces) -> one space, trailing spaces of each
    line removed, three or more newlines -> two, and the ends stripped.

    Paragraph breaks ("\\n\\n") survive, so HH-RLHF's "\\n\\nHuman:" turn markers stay intact.
    """
    if form:
        text = unicodedata.normalize(form, text)
    if not whitespace:
        return text
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(_SPACES.sub(" ", line).rstrip() for line in text.split("\n"))
    return _MANY_NEWLINES.sub("\n\n", text).strip()


def words(text: str) -> list[str]:
    """Lower-cased word tokens (`\\w+`): the unit of length, repetition, shingles and decontamination n-grams."""
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> list[tuple[str, ...]]:
    """Consecutive n-grams; a text shorter than n gives its whole token list as one gram (when not empty)."""
    if len(tokens) < n:
        return [tuple(tokens)] if tokens else []
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def repeated_ngram_fraction(tokens: list[str], n: int) -> float:
    """Share of n-gram occurrences that repeat an earlier one: 1 - distinct / total (0 for fewer than n tokens).

    "a b a b a b" with n=2: grams ab, ba, ab, ba, ab -> 2 distinct of 5 -> 0.6. Natural prose stays low; boiler-
    plate loops and degenerate model outputs ("I'm sorry. I'm sorry. ...") score high.
    """
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def alpha_fraction(text: str) -> float:
    """Share of non-whitespace characters that are letters (Unicode category L*); 1.0 for an all-space text."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isalpha() for c in chars) / len(chars) if chars else 1.0


def bad_char_fraction(text: str) -> float:
    """Share of characters that are control characters other than tab/newline, or U+FFFD (a decoding error)."""
    if not text:
        return 0.0
    bad = sum(1 for c in text if c == "\ufffd" or (unicodedata.category(c) == "Cc" and c not in "\t\n"))
    return bad / len(text)


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum of payment card numbers: double every second digit from the right, sum the digits of
    the results, valid when the total is divisible by 10 ("4111111111111111" -> 30 -> valid)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


PII_KINDS = ("email", "phone", "ip", "card")
_PII_PATTERNS: dict[str, re.Pattern] = {
    "email": re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}\b"),
    # Card-like: 16 digits starting 2-6 (Visa, Mastercard, Discover...) or American Express's 4-6-5 (34/37), bare
    # or in groups; Luhn-checked before replacing. A bare 13-digit timestamp or ID is not one.
    "card": re.compile(r"(?<![\d-])(?:[2-6]\d{3}(?:[ -]?\d{4}){3}|3[47]\d{2}[ -]?\d{6}[ -]?\d{5})(?![\d-])"),
    "ip": re.compile(r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}"
                     r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?![\d.])"),
    # 3-3-4 digit groups with separators, optionally (area code) and a country code ("+44 ", "1-"); a bare run of
    # digits is not one.
    "phone": re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?|\d{1,3}[ .-])?(?:\(\d{3}\) ?|\d{3}[ .-])\d{3}[ .-]\d{4}(?!\w)"),
}
_ARITHMETIC = re.compile(r"\s*(?:=|[-+*/x]\s*[\d.,]+\s*=)")  # "... = 500", "... + 3 = 8": a sum, not an identifier
PII_TOKENS = {"email": "<EMAIL>", "phone": "<PHONE>", "ip": "<IP>", "card": "<CARD>"}


def scrub_pii(text: str, kinds: Iterable[str] = PII_KINDS) -> tuple[str, Counter]:
    """Replaces e-mail addresses, card-like numbers (16-digit or Amex 15-digit, Luhn-valid), IPv4 addresses and
    phone numbers (3-3-4 digits with separators) by placeholder tokens; returns the new text and a count per kind.

    Order matters: cards before phones (a card's digit groups also look like a phone number), IPs before phones.
    """
    counts: Counter = Counter()
    for kind in ("email", "card", "ip", "phone"):
        if kind not in kinds:
            continue
        pattern, token = _PII_PATTERNS[kind], PII_TOKENS[kind]

        def replace(m: re.Match, kind: str = kind, token: str = token) -> str:
            if kind == "card" and not luhn_valid(re.sub(r"\D", "", m.group(0))):
                return m.group(0)
            if _ARITHMETIC.match(m.string, m.end()) or m.string[max(m.start() - 2, 0) : m.start()] == "<<":
                return m.group(0)  # "1200-400-300=500" and calculator annotations are sums, not phone numbers
            counts[kind] += 1
            return token

        text = pattern.sub(replace, text)
    return text, counts


def ngram_overlap(tokens: list[str], reference: set[tuple[str, ...]], n: int) -> int:
    """How many distinct word n-grams of `tokens` appear in `reference` (the evaluation set's n-grams).

    The decontamination test of GPT-3 (Brown et al. 2020, appendix C) flags a training document sharing any
    13-gram with a benchmark; `min_overlaps` in the config sets how many shared n-grams flag a row.
    """
    if len(tokens) < n:
        return 0
    return sum(1 for g in {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)} if g in reference)


def wordy_ngram(gram: tuple[str, ...]) -> bool:
    """True when at least half the n-gram's words contain a letter. Decontamination counts only these: GSM8K's
    calculator annotations ("<<10*2=20>>20" -> 10 2 20 20) make numeric 8-grams shared by unrelated problems."""
    return 2 * sum(any(c.isalpha() for c in w) for w in gram) >= len(gram)


def shingles(tokens: list[str], k: int) -> set[bytes]:
    """The set of word k-shingles of a text, UTF-8 encoded for MinHash (a text shorter than k: one shingle)."""
    return {" ".join(g).encode("utf-8") for g in ngrams(tokens, k)}


def text_hash(text: str) -> bytes:
    """An 8-byte digest of the normalised text for exact deduplication (collision odds ~n^2 / 2^65)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()


# --------------------------------------------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class NormalizeConfig:
    """Unicode and whitespace normalisation of every content string."""

    unicode_form: Literal["NFC", "NFKC", "none"] = help_field(
        "Unicode normal form: NFC (compose accents, keeps ligatures and full-width forms), NFKC (also folds "
        "compatibility characters, e.g. full-width digits), none.", "NFC")
    whitespace: bool = help_field(
        "CRLF -> LF, runs of spaces/tabs -> one space, trailing spaces off, 3+ newlines -> 2, ends stripped.", True)


@dataclass(frozen=True)
class FilterConfig:
    """Quality filters on the row's text (its content strings joined by newlines)."""

    drop_empty_turns: bool = help_field("Drop rows with a content string (a turn) that is empty after normalising.", True)
    min_chars: int = help_field("Drop rows with fewer characters.", 1)
    max_chars: int | None = help_field("Drop rows with more characters; null: no limit.", None)
    min_words: int = help_field("Drop rows with fewer words.", 1)
    max_words: int | None = help_field("Drop rows with more words; null: no limit.", None)
    min_alpha_fraction: float = help_field("Drop rows whose share of letters among non-space characters is lower.", 0.25)
    max_bad_char_fraction: float = help_field(
        "Drop rows whose share of control characters and U+FFFD (decoding errors) is higher.", 0.001)
    repetition_ngram: int = help_field("Word n-gram size of the repetition filter.", 3)
    max_repeated_ngram_fraction: float = help_field(
        "Drop rows whose share of repeated word n-grams (1 - distinct/total) is higher; 1: off.", 0.5)

    def validate(self) -> None:
        for name in ("min_alpha_fraction", "max_bad_char_fraction", "max_repeated_ngram_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"filters.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.repetition_ngram < 1:
            raise ConfigError(f"filters.repetition_ngram must be >= 1, got {self.repetition_ngram}")


@dataclass(frozen=True)
class PIIConfig:
    """Optional scrubbing of personal data (rows are kept; matches are replaced and counted)."""

    enabled: bool = help_field("Replace matches with <EMAIL>, <PHONE>, <IP>, <CARD>.", False)
    kinds: tuple[Literal["email", "phone", "ip", "card"], ...] = help_field(
        "Which kinds to scrub.", ("email", "phone", "ip", "card"))


@dataclass(frozen=True)
class DecontaminateConfig:
    """Drop training rows that share word n-grams with evaluation sets, so held-out figures stay honest."""

    eval_sets: tuple[str, ...] = help_field(
        "Evaluation datasets (files or folders the data layer reads), e.g. [gsm8k/test.jsonl]; "
        "empty: no decontamination.", ())
    ngram: int = help_field("Word n-gram size (13 as in GPT-3's contamination study; 8 is stricter).", 13)
    min_overlaps: int = help_field("Drop a row sharing at least this many distinct n-grams with the evaluation sets.", 1)

    def validate(self) -> None:
        if self.ngram < 1 or self.min_overlaps < 1:
            raise ConfigError("decontaminate.ngram and decontaminate.min_overlaps must be >= 1")


@dataclass(frozen=True)
class NearDedupConfig:
    """Near-duplicate removal with MinHash LSH (datasketch)."""

    enabled: bool = help_field("Remove rows whose text is a near copy of an earlier kept row.", True)
    threshold: float = help_field("Jaccard similarity of word shingles at which two rows count as near duplicates.", 0.7)
    shingle_size: int = help_field("Words per shingle.", 5)
    num_perm: int = help_field("MinHash permutations (more: a sharper estimate, more memory per row).", 128)
    seed: int = help_field("MinHash seed.", 1)
    false_negative_weight: float = help_field(
        "How the LSH bands are chosen: the weight of missing a near duplicate against that of a false candidate "
        "(datasketch's weights). Above 0.5 favours recall; false candidates are then removed by comparing the "
        "MinHash signatures against the threshold.", 0.8)

    def validate(self) -> None:
        if not 0.0 < self.false_negative_weight < 1.0:
            raise ConfigError(f"near_dedup.false_negative_weight must be in (0, 1), got {self.false_negative_weight}")
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"near_dedup.threshold must be in (0, 1), got {self.threshold}")
        if self.shingle_size < 1 or self.num_perm < 16:
            raise ConfigError("near_dedup.shingle_size must be >= 1 and near_dedup.num_perm >= 16")


@dataclass(frozen=True)
class CleanConfig:
    """`tempax data clean`: every step and threshold (the steps: `clean_rows`)."""

    normalize: NormalizeConfig = help_field("Unicode and whitespace normalisation.", default_factory=NormalizeConfig)
    filters: FilterConfig = help_field("Length, character-class, repetition and empty-turn filters.",
                                  default_factory=FilterConfig)
    pii: PIIConfig = help_field("PII scrubbing.", default_factory=PIIConfig)
    decontaminate: DecontaminateConfig = help_field("Decontamination against evaluation sets.",
                                               default_factory=DecontaminateConfig)
    exact_dedup: bool = help_field("Remove rows whose normalised text equals an earlier kept row's.", True)
    near_dedup: NearDedupConfig = help_field("Near-duplicate removal.", default_factory=NearDedupConfig)
    max_bad_fraction: float = help_field("Fail when more than this fraction of rows is malformed.", 0.1)
    examples_per_reason: int = help_field("Rows quoted in the report for each drop reason.", 3)


# Which setting to loosen for each drop reason (named in the report and in the empty-result error).
REASON_KEYS = {
    "empty_content": "filters.drop_empty_turns=false",
    "too_short": "filters.min_chars / filters.min_words",
    "too_long": "filters.max_chars / filters.max_words",
    "low_alpha": "filters.min_alpha_fraction",
    "bad_chars": "filters.max_bad_char_fraction",
    "repetitive": "filters.max_repeated_ngram_fraction",
    "contaminated": "decontaminate.ngram / decontaminate.min_overlaps",
    "exact_duplicate": "exact_dedup=false",
    "near_duplicate": "near_dedup.threshold (higher keeps more)",
}


# --------------------------------------------------------------------------------------------------------------
# Report


@dataclass
class CleanReport:
    """What `clean_rows` did: rows kept, skipped (malformed) and dropped per reason, with examples."""

    input: str
    output: str | None = None
    kind: str | None = None
    total: int = 0
    kept: int = 0
    normalized: int = 0  # kept rows whose text changed under normalisation
    skipped: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    pii: Counter = field(default_factory=Counter)
    examples: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    eval_ngrams: int = 0
    seconds: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)

    def skip(self, reason: str, where: str, detail: str, limit: int) -> None:
        """A malformed row (reasons: `tempax.data.reasons.MALFORMED`), quoted with its `file:line`."""
        self.skipped[reasons.check(reason, reasons.MALFORMED)] += 1
        self.record(reason, where, detail, limit)

    def drop(self, reason: str, where: str, text: str, limit: int, **extra: str) -> None:
        """A row a filter removed (reasons: `tempax.data.reasons.DROPPED`), quoted with its `file:line`."""
        self.dropped[reasons.check(reason, reasons.DROPPED)] += 1
        self.record(reason, where, text, limit, **extra)

    def record(self, reason: str, where: str, text: str, limit: int, **extra: str) -> None:
        items = self.examples.setdefault(reason, [])
        if len(items) < limit:
            snippet = text if len(text) <= 200 else text[:197] + "..."
            items.append({"where": where, "text": snippet, **extra})

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": self.input, "output": self.output, "kind": self.kind, "total": self.total, "kept": self.kept,
            "normalized": self.normalized, "skipped": dict(self.skipped), "dropped": dict(self.dropped),
            "pii_replaced": dict(self.pii), "eval_ngrams": self.eval_ngrams, "examples": self.examples,
            "seconds": round(self.seconds, 2), "config": self.config,
        }

    def table(self) -> str:
        """A readable table: one line per outcome with its count, share and the setting that controls it."""
        def line(label: str, n: int, note: str = "") -> str:
            share = f"{n / self.total:6.1%}" if self.total else "     -"
            return f"  {label:<18} {n:>9,}  {share}  {note}".rstrip()

        out = [f"{self.input} ({self.kind or 'unknown kind'}): {self.total:,} rows in {self.seconds:.1f} s",
               line("kept", self.kept, f"-> {self.output}" if self.output else "(dry run: nothing written)")]
        for reason, n in self.skipped.most_common():
            out.append(line(reason, n, "skipped (malformed)"))
        for reason, n in self.dropped.most_common():
            out.append(line(reason, n, f"dropped; setting: {REASON_KEYS.get(reason, '')}"))
        if self.normalized:
            out.append(line("normalized", self.normalized, "kept rows changed by Unicode/whitespace normalisation"))
        for kind, n in self.pii.most_common():
            out.append(f"  pii {kind:<14} {n:>9,}  replaced by {PII_TOKENS[kind]}")
        for reason, items in self.examples.items():
            for ex in items:
                dup = f" (duplicate of {ex['duplicate_of']})" if "duplicate_of" in ex else ""
                out.append(f"  e.g. {reason} {ex['where']}{dup}: {ex['text']!r}")
        return "\n".join(out)


# --------------------------------------------------------------------------------------------------------------
# The pipeline


def load_eval_ngrams(paths: Iterable[str], n: int) -> set[tuple[str, ...]]:
    """Every word n-gram (`wordy_ngram` ones) of every content string of the evaluation sets."""
    grams: set[tuple[str, ...]] = set()
    for path in paths:
        found = False
        for row in iter_rows(path):
            kind = row_kind(row.data) if row.data is not None else None
            strings = content_strings(row.data, kind) if kind else None
            for s in strings or ():
                found = True
                tokens = words(normalize_text(s))
                grams.update(g for g in ngrams(tokens, n) if len(g) == n and wordy_ngram(g))
        if not found:
            raise DataError(f"decontaminate.eval_sets: {path} holds no readable rows (text, chat, qa, ...); "
                            "pass an evaluation file the data layer reads, e.g. gsm8k/test.jsonl")
    return grams


class _NearDuplicates:
    """MinHash LSH over kept rows: `find(tokens)` -> the first kept row it nearly copies, else None."""

    def __init__(self, cfg: NearDedupConfig):
        from datasketch import MinHash, MinHashLSH

        self.cfg = cfg
        w = cfg.false_negative_weight
        self._lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm, weights=(1.0 - w, w))
        self._signatures: dict[str, np.ndarray] = {}  # kept row -> its uint32 signature, to confirm candidates
        self._template = MinHash(num_perm=cfg.num_perm, seed=cfg.seed)  # holds the permutations, built once

    def signature(self, tokens: list[str]) -> Any:
        m = self._template.copy()  # the template is never updated: a copy is an empty MinHash
        m.update_batch(list(shingles(tokens, self.cfg.shingle_size)))
        return m

    def find(self, key: str, tokens: list[str]) -> str | None:
        """The first kept row whose estimated Jaccard similarity reaches the threshold; else records `key`."""
        m = self.signature(tokens)
        for cand in self._lsh.query(m):
            if np.mean(self._signatures[cand] == m.hashvalues) >= self.cfg.threshold:
                return cand
        self._lsh.insert(key, m)
        self._signatures[key] = m.hashvalues.astype(np.uint32)
        return None


def filter_reason(text: str, tokens: list[str], f: FilterConfig) -> str | None:
    """The first quality filter the row's text fails ("too_short", "too_long", "low_alpha", "bad_chars",
    "repetitive"), or None when it passes them all. `tokens` is `words(text)`."""
    if len(text) < f.min_chars or len(tokens) < f.min_words:
        return "too_short"
    if f.max_chars is not None and len(text) > f.max_chars:
        return "too_long"
    if f.max_words is not None and len(tokens) > f.max_words:
        return "too_long"
    if alpha_fraction(text) < f.min_alpha_fraction:
        return "low_alpha"
    if bad_char_fraction(text) > f.max_bad_char_fraction:
        return "bad_chars"
    if repeated_ngram_fraction(tokens, f.repetition_ngram) > f.max_repeated_ngram_fraction:
        return "repetitive"
    return None


def clean_rows(rows: Iterable[Row], cfg: CleanConfig, report: CleanReport) -> Iterator[dict[str, Any]]:
    """The cleaned rows to keep, in input order; counts everything in `report`.

    Each row goes through these steps in order; the first one that rejects it names the reason it is dropped:

      1. parse          malformed rows are *skipped*, by the reasons training gives them (`tempax.data.reasons`):
                        "invalid_utf8", "invalid_json", "not_an_object", "unknown_format" (no row kind's keys),
                        "wrong_type" (a content field that is not a string or a list of messages)
      2. normalise      Unicode normal form (NFC by default) and whitespace (`normalize_text`) on every content string
      3. empty turn     a content string that is empty after normalising: "empty_content"
      4. PII            optional: e-mail addresses, phone numbers, IPv4 addresses and card-like numbers (Luhn-valid)
                        replaced by <EMAIL>, <PHONE>, <IP>, <CARD>; counted per kind, the row is kept
      5. length         characters and words of the row's text: "too_short" / "too_long"
      6. characters     share of letters (`alpha_fraction`): "low_alpha"; share of control / replacement characters
                        (`bad_char_fraction`): "bad_chars"
      7. repetition     share of repeated word n-grams (`repeated_ngram_fraction`): "repetitive"
      8. decontaminate  word n-grams shared with an evaluation set (`ngram_overlap`): "contaminated"
      9. exact dedup    the same normalised text as an earlier kept row: "exact_duplicate"
     10. near dedup     MinHash LSH (`datasketch`) over word shingles, candidates confirmed by the MinHash Jaccard
                        estimate: "near_duplicate"

    The row's text is its content strings (see `tempax.data.kinds`) joined by newlines. Memory: rows stream from
    the input to the output file; what is kept is one 8-byte hash per kept row (exact dedup), the LSH index and a
    `num_perm` x 4-byte signature per kept row (near dedup), and the evaluation sets' n-grams.

    A file must hold one row kind; a row of another kind stops the run with a `DataError` naming both lines.
    """
    f = cfg.filters
    form = None if cfg.normalize.unicode_form == "none" else cfg.normalize.unicode_form
    whitespace = cfg.normalize.whitespace
    eval_grams = load_eval_ngrams(cfg.decontaminate.eval_sets, cfg.decontaminate.ngram)
    report.eval_ngrams = len(eval_grams)
    seen: set[bytes] = set()
    near = _NearDuplicates(cfg.near_dedup) if cfg.near_dedup.enabled else None
    first_where = ""
    limit = cfg.examples_per_reason

    for row in rows:
        report.total += 1
        if row.data is None:
            report.skip(row.reason, row.where, row.error or "", limit)
            continue
        kind = row_kind(row.data)
        if kind is None:
            report.skip("unknown_format", row.where, f"keys {sorted(row.data)}", limit)
            continue
        if content_strings(row.data, kind) is None:
            report.skip("wrong_type", row.where, f"a {kind} row whose content is not text or a list of messages "
                                                 f"(keys {sorted(row.data)})", limit)
            continue
        if report.kind is None:
            report.kind, first_where = kind, row.where
        elif kind != report.kind:
            raise mixed_kinds_error(row.where, kind, report.kind, first_where)
        original = content_strings(row.data, kind)
        data = map_content(row.data, kind, lambda s: normalize_text(s, form=form, whitespace=whitespace))
        strings = content_strings(data, kind)
        text = "\n".join(strings)
        changed = strings != original

        def drop(reason: str, **extra: str) -> None:
            report.drop(reason, row.where, text, limit, **extra)

        if f.drop_empty_turns and any(not s for s in strings):
            drop("empty_content")
            continue
        pii: Counter = Counter()
        if cfg.pii.enabled:
            def scrub(s: str) -> str:
                s, c = scrub_pii(s, cfg.pii.kinds)
                pii.update(c)
                return s

            data = map_content(data, kind, scrub)
            if pii:
                strings = content_strings(data, kind)
                text = "\n".join(strings)
        tokens = words(text)
        reason = filter_reason(text, tokens, f)
        if reason is None and eval_grams:
            shared = sum(ngram_overlap(words(s), eval_grams, cfg.decontaminate.ngram) for s in strings)
            reason = "contaminated" if shared >= cfg.decontaminate.min_overlaps else None
        if reason is not None:
            drop(reason)
            continue
        if cfg.exact_dedup:
            digest = text_hash(text)
            if digest in seen:
                drop("exact_duplicate")
                continue
        if near is not None:
            dup_of = near.find(row.where, tokens)
            if dup_of is not None:
                drop("near_duplicate", duplicate_of=dup_of)
                continue
        if cfg.exact_dedup:
            seen.add(digest)
        report.kept += 1
        report.normalized += changed
        report.pii.update(pii)  # counted for kept rows: what the output file has had replaced
        yield data


def _check(report: CleanReport, cfg: CleanConfig) -> None:
    bad = sum(report.skipped.values())
    if report.total and bad / report.total > cfg.max_bad_fraction:
        ex = "; ".join(f"{e['where']}: {reason} ({e['text']})" for reason in report.skipped
                       for e in report.examples.get(reason, []))
        raise DataError(
            f"{report.input}: {bad} of {report.total} rows are malformed ({bad / report.total:.1%} > "
            f"max_bad_fraction={cfg.max_bad_fraction}; by reason: {dict(report.skipped)}); e.g. {ex}. Rows must be "
            "chat ('messages'), prompt/completion, preference ('chosen'/'rejected'), question/answer or 'text' "
            "objects; fix the file or raise max_bad_fraction."
        )
    if report.kept == 0:
        if report.total == 0:
            raise DataError(f"{report.input} holds no rows; pass a non-empty dataset file.")
        dropped = ", ".join(f"{r} {n}" for r, n in report.dropped.most_common()) or "none"
        top = report.dropped.most_common(1)
        hint = f"; loosen {REASON_KEYS.get(top[0][0], top[0][0])}" if top else ""
        raise DataError(
            f"{report.input}: nothing is left after cleaning: all {report.total} rows were removed (dropped: "
            f"{dropped}; malformed: {bad}){hint}, or check that the file is the one you meant."
        )


def _counted(rows: Iterable[Row], desc: str) -> Iterator[Row]:
    """`rows` under a bar counting them (a streamed file's length is not known ahead, so a rate and no ETA)."""
    with work_bar(None, desc, unit="row") as bar:
        for row in rows:
            yield row
            bar.update(1)


def _open_out(path: str, gz: bool):
    return gzip.open(path, "wt", encoding="utf-8") if gz else open(path, "w", encoding="utf-8")


def check_output(input_path: str, output_path: str, *, overwrite: bool = False) -> None:
    """Refuses to replace a file unasked: OUT must not exist, and OUT being IN (cleaning in place) needs
    `overwrite` too.

    Raises:
      ConfigError: OUT exists (or is IN) and `overwrite` is false, or OUT is a folder.
    """
    if os.path.isdir(output_path):
        raise ConfigError(f"OUT {output_path} is a folder; name the cleaned JSON Lines file, e.g. "
                          f"{os.path.join(output_path, 'clean.jsonl')}")
    if overwrite or not os.path.lexists(output_path):
        return
    same = os.path.exists(input_path) and os.path.samefile(input_path, output_path)
    if same:
        raise ConfigError(f"OUT {output_path} is IN: cleaning would replace the input. Name another OUT, or add "
                          "--overwrite to replace IN with the cleaned rows (written whole, then renamed over it)")
    raise ConfigError(f"OUT {output_path} exists; name another OUT, or add --overwrite to replace it")


def clean_file(
    input_path: str, output_path: str | None, cfg: CleanConfig = CleanConfig(), *, split: str | None = None,
    overwrite: bool = False,
) -> CleanReport:
    """Cleans `input_path` into the JSON Lines file `output_path` (gzip when it ends in .gz); None: dry run.

    An existing `output_path` (`input_path` itself included) is replaced only with `overwrite` (`check_output`).
    The output is written to a temporary file beside it and renamed at the end, so a failed run leaves no half
    file and the old one (the input, when cleaning in place) as it was.

    Raises:
      ConfigError: `output_path` exists and `overwrite` is false.
      DataError: the input cannot be read, mixes row formats, has too many malformed rows, or nothing is left.
    """
    if output_path is not None:
        check_output(input_path, output_path, overwrite=overwrite)
    start = time.perf_counter()
    report = CleanReport(input=input_path, output=output_path, config=to_dict(cfg))
    rows = _counted(iter_rows(input_path, split=split), f"cleaning {os.path.basename(input_path)}")
    tmp = None
    try:
        if output_path is None:
            for _ in clean_rows(rows, cfg, report):
                pass
        else:
            folder = os.path.dirname(os.path.abspath(output_path))
            os.makedirs(folder, exist_ok=True)
            # A name no one else uses, created with the permissions a new file gets (mkstemp's are owner-only).
            tmp = os.path.join(folder, f".{os.path.basename(output_path)}.{uuid.uuid4().hex[:12]}.partial")
            with _open_out(tmp, output_path.endswith(".gz")) as out:
                for data in clean_rows(rows, cfg, report):
                    out.write(json.dumps(data, ensure_ascii=False) + "\n")
        report.seconds = time.perf_counter() - start
        _check(report, cfg)
        if tmp is not None:
            os.replace(tmp, output_path)
            tmp = None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
    return report
