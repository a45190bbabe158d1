"""`tempax data clean`: each filter and score as a pure function, the LSH on planted paraphrases, the pipeline
end to end, and the bad-input messages."""

from __future__ import annotations

import gzip
import json
import os
import random

import pytest

from tempax.data.clean import (
    CleanConfig,
    CleanReport,
    DecontaminateConfig,
    FilterConfig,
    NearDedupConfig,
    PIIConfig,
    alpha_fraction,
    bad_char_fraction,
    clean_file,
    clean_rows,
    filter_reason,
    luhn_valid,
    ngram_overlap,
    ngrams,
    normalize_text,
    repeated_ngram_fraction,
    scrub_pii,
    shingles,
    words,
    wordy_ngram,
)
from tempax.data.kinds import content_strings, map_content, row_kind, turn_count
from tempax.data.sources import as_rows
from tempax.errors import ConfigError, DataError


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


# ---------------------------------------------------------------------------------------------- pure functions


def test_normalize_text():
    """NFC composes e + combining acute into é; tabs/no-break spaces -> one space; trailing spaces and 3+
    newlines collapse; CRLF -> LF; paragraph breaks (HH-RLHF's turn markers) survive."""
    assert normalize_text("cafe\u0301") == "caf\u00e9"
    assert normalize_text("a\t\u00a0 b  \r\nc   \n\n\n\nd ") == "a b\nc\n\nd"
    assert normalize_text("\n\nHuman: hi\n\nAssistant: yo") == "Human: hi\n\nAssistant: yo"
    assert normalize_text("\uff11", form="NFKC") == "1" and normalize_text("\uff11") == "\uff11"
    assert normalize_text("a  b", whitespace=False) == "a  b"


def test_words_and_ngrams():
    assert words("Hello, World! It's 42.") == ["hello", "world", "it", "s", "42"]
    assert ngrams(["a", "b", "c"], 2) == [("a", "b"), ("b", "c")]
    assert ngrams(["a"], 3) == [("a",)] and ngrams([], 3) == []
    assert shingles(["a", "b", "c"], 2) == {b"a b", b"b c"}


def test_repeated_ngram_fraction():
    """'a b a b a b', n=2: grams ab ba ab ba ab -> 2 distinct of 5 -> 1 - 2/5 = 0.6; all distinct -> 0."""
    assert repeated_ngram_fraction("a b a b a b".split(), 2) == pytest.approx(0.6)
    assert repeated_ngram_fraction("one two three four".split(), 2) == 0.0
    assert repeated_ngram_fraction(["a"], 2) == 0.0


def test_character_classes():
    """'ab12' -> 2 letters of 4 = 0.5 (spaces ignored); 'ab\\x00\\ufffd' -> 2 bad of 4 = 0.5; tab/newline are fine."""
    assert alpha_fraction("ab 12") == 0.5
    assert alpha_fraction("   ") == 1.0
    assert bad_char_fraction("ab\x00\ufffd") == 0.5
    assert bad_char_fraction("a\tb\n") == 0.0


def test_luhn():
    """4111 1111 1111 1111: doubled digits from the right give 8 x (1+1) ... total 30 -> divisible by 10."""
    assert luhn_valid("4111111111111111")
    assert not luhn_valid("4111111111111112")
    assert luhn_valid("79927398713")  # the textbook example


def test_scrub_pii_replaces_and_counts():
    text = ("mail bob.smith+x@example.co.uk or call 555-123-4567 / (555) 123-4567 / 1-800-222-1222, server "
            "192.168.0.1, card 4111 1111 1111 1111 or 378282246310005")
    out, counts = scrub_pii(text)
    assert out == "mail <EMAIL> or call <PHONE> / <PHONE> / <PHONE>, server <IP>, card <CARD> or <CARD>"
    assert counts == {"email": 1, "phone": 3, "ip": 1, "card": 2}
    only, c = scrub_pii(text, kinds=("email",))
    assert "<EMAIL>" in only and "555-123-4567" in only and c == {"email": 1}


def test_scrub_pii_leaves_numbers_that_are_not_pii():
    """GSM8K arithmetic ('960-480-120 = <<960-480-120=360>>360'), a Luhn-invalid 16-digit number, a version
    string, thousands separators and a 13-digit timestamp are not personal data."""
    for text in ("Derek has 960-480-120 = <<960-480-120=360>>360 dollars", "id 4111 1111 1111 1112",
                 "phone=1234567&_=1522680495750",
                 "version 1.2.3", "$1,000,000-$150,000=$<<1000000-150000=850000>>850,000"):
        assert scrub_pii(text) == (text, {})


def test_filter_reason_in_order():
    """Length first, then letters, control characters, repetition; a clean sentence passes."""
    f = FilterConfig(min_words=3, max_chars=40)
    check = lambda text: filter_reason(text, words(text), f)  # noqa: E731
    assert check("two words") == "too_short"
    assert check("a sentence that is certainly longer than forty characters") == "too_long"
    assert check("12 34 56 78 ab") == "low_alpha"
    assert check("bad \x00 control here") == "bad_chars"
    assert check("no no no no no no no") == "repetitive"  # 5 trigrams, 1 distinct: 0.8 > 0.5
    assert check("a plain clean sentence") is None


def test_wordy_ngram():
    """'cost 10 x 2' has 2 words with letters of 4 -> counts; '10 2 20 20' has none -> ignored."""
    assert wordy_ngram(("cost", "10", "x", "2")) and not wordy_ngram(("10", "2", "20", "20"))


def test_ngram_overlap():
    """3-grams of 'a b c d': abc, bcd; the reference holds bcd and xyz -> 1 shared."""
    assert ngram_overlap("a b c d".split(), {("b", "c", "d"), ("x", "y", "z")}, 3) == 1
    assert ngram_overlap(["a", "b"], {("a", "b")}, 3) == 0  # shorter than n: never contaminated by n-grams


def test_row_kinds_and_content():
    chat = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "source": "x"}
    assert row_kind(chat) == "messages" and content_strings(chat, "messages") == ["q", "a"]
    assert turn_count(chat, "messages") == 2
    upper = map_content(chat, "messages", str.upper)
    assert upper["messages"][1] == {"role": "assistant", "content": "A"} and upper["source"] == "x"
    assert chat["messages"][1]["content"] == "a"  # the input row is not changed
    hh = {"chosen": "\n\nHuman: hi\n\nAssistant: yo", "rejected": "\n\nHuman: hi\n\nAssistant: no"}
    assert row_kind(hh) == "preference" and turn_count(hh, "preference") == 2
    assert row_kind({"question": "1+1?", "answer": "#### 2"}) == "qa"
    assert row_kind({"prompt": "p", "completion": "c"}) == "prompt_completion"
    assert row_kind({"text": "t"}) == "text"
    assert row_kind({"foo": 1}) is None
    assert content_strings({"text": 3}, "text") is None


# ---------------------------------------------------------------------------------------------- near duplicates


def _near_dup_corpus(seed: int = 0):
    """60 distinct 60-word documents; 30 planted near copies (one word replaced, inserted or deleted, or only
    case / punctuation / spacing changed: Jaccard of 5-shingles 0.84-1.0), and 20 hard negatives that share
    their first half with a document (Jaccard ~0.3). Returns (texts, planted index -> original index)."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8))) for _ in range(3000)]
    docs = [[rng.choice(vocab) for _ in range(60)] for _ in range(60)]
    texts = [" ".join(d) for d in docs]
    planted: dict[int, int] = {}
    for j in range(30):
        src = docs[j]
        w = list(src)
        pos = rng.randrange(5, 55)
        kind = j % 4
        if kind == 0:
            w[pos] = rng.choice(vocab)
        elif kind == 1:
            w.insert(pos, rng.choice(vocab))
        elif kind == 2:
            del w[pos]
        text = " ".join(w)
        if kind == 3:
            text = text.upper().replace(" ", "  ", 5) + "!"
        planted[len(texts)] = j
        texts.append(text)
    for j in range(30, 50):
        texts.append(" ".join(docs[j][:30] + [rng.choice(vocab) for _ in range(30)]))
    return texts, planted


def test_near_duplicate_lsh_recall_and_precision():
    """At the default threshold (0.7, 5-word shingles, 128 permutations) the LSH finds every planted near copy
    (recall 1.0) and flags no distinct or half-overlapping document (precision 1.0); each flagged row names its
    original."""
    texts, planted = _near_dup_corpus()
    cfg = CleanConfig(filters=FilterConfig(min_alpha_fraction=0.0), exact_dedup=False, examples_per_reason=1000)
    report = CleanReport(input="<memory>")
    kept = list(clean_rows(as_rows([{"text": t} for t in texts]), cfg, report))
    flagged = {int(e["where"].split(":")[1]) - 1: int(e["duplicate_of"].split(":")[1]) - 1
               for e in report.examples["near_duplicate"]}
    assert len(kept) + len(flagged) == len(texts)
    true_pos = sum(1 for i, j in flagged.items() if planted.get(i) == j)
    recall, precision = true_pos / len(planted), true_pos / len(flagged)
    assert recall == 1.0 and precision == 1.0, (recall, precision)


def test_near_duplicate_threshold_is_respected():
    """One replaced word in 60 leaves Jaccard(5-shingles) = 51 / 61 = 0.84: kept at threshold 0.9."""
    texts, planted = _near_dup_corpus()
    cfg = CleanConfig(filters=FilterConfig(min_alpha_fraction=0.0), exact_dedup=False,
                      near_dedup=NearDedupConfig(threshold=0.95), examples_per_reason=1000)
    report = CleanReport(input="<memory>")
    list(clean_rows(as_rows([{"text": t} for t in texts]), cfg, report))
    # Only the case/punctuation/spacing copies (Jaccard 1 after normalising) are left to find.
    assert report.dropped["near_duplicate"] == sum(1 for j in planted.values() if j % 4 == 3)


# ---------------------------------------------------------------------------------------------- the pipeline


def test_clean_file_end_to_end(tmp_path):
    good = "The committee approved the new budget after a long debate about school funding."
    rows = [
        {"messages": [{"role": "user", "content": "Tell me  about the budget."},
                      {"role": "assistant", "content": good}]},
        {"messages": [{"role": "user", "content": "Tell me about the budget."},
                      {"role": "assistant", "content": good + "  "}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "   "}]},
        {"messages": [{"role": "user", "content": "sorry " * 30}, {"role": "assistant", "content": "sorry " * 30}]},
        {"messages": [{"role": "user", "content": "1234 5678 9012"},
                      {"role": "assistant", "content": "3456 7890 = 42"}]},
        {"messages": [{"role": "user", "content": "Mail me at jane@example.com please, the report is due."},
                      {"role": "assistant", "content": "I will send it to you by Friday afternoon at the latest."}]},
        {"messages": [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April, and then she sold "
                                                  "half as many clips in May."},
                      {"role": "assistant", "content": "She sold 72 clips in all."}]},
        {"messages": [{"role": "user", "content": "Control\x00chars\x00here\x00and\x00there"},
                      {"role": "assistant", "content": "This answer text is perfectly ordinary prose."}]},
        "{not json",
    ]
    src = _write_jsonl(tmp_path / "in.jsonl", rows)
    evalset = _write_jsonl(tmp_path / "eval.jsonl", [
        {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                     "How many clips did Natalia sell altogether?", "answer": "#### 72"}])
    cfg = CleanConfig(pii=PIIConfig(enabled=True), decontaminate=DecontaminateConfig(eval_sets=(evalset,)),
                      max_bad_fraction=0.2)
    out = str(tmp_path / "out.jsonl.gz")
    report = clean_file(src, out, cfg)
    assert report.kind == "messages" and report.total == 9 and report.kept == 2
    assert report.skipped == {"invalid_json": 1}  # the reasons training gives (tempax.data.reasons)
    assert report.dropped == {"exact_duplicate": 1, "empty_content": 1, "repetitive": 1, "low_alpha": 1,
                              "contaminated": 1, "bad_chars": 1}
    assert report.pii == {"email": 1}
    with gzip.open(out, "rt") as f:
        kept = [json.loads(line) for line in f]
    assert kept[0]["messages"][0]["content"] == "Tell me about the budget."  # normalised
    assert "<EMAIL>" in kept[1]["messages"][0]["content"]
    assert report.examples["exact_duplicate"][0]["where"].endswith(":2")
    d = report.to_dict()
    assert d["dropped"]["contaminated"] == 1 and d["pii_replaced"] == {"email": 1}
    table = report.table()
    assert "contaminated" in table and "decontaminate.ngram" in table and "kept" in table
    assert not os.path.exists(out + ".tmp")


def test_dry_run_writes_nothing(tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl", [{"text": "a plain sentence of text"}] * 3)
    report = clean_file(src, None)
    assert report.kept == 1 and report.dropped == {"exact_duplicate": 2} and report.output is None
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_an_existing_out_or_in_itself_is_replaced_only_with_overwrite(tmp_path):
    """OUT = IN (cleaning in place) and an existing OUT are refused before a row is read; with `overwrite` the
    cleaned rows replace the file whole, keeping the permissions a new file gets."""
    rows = [{"text": "a plain sentence of text"}] * 3
    src = _write_jsonl(tmp_path / "in.jsonl", rows)
    original = open(src).read()
    with pytest.raises(ConfigError, match=r"OUT .*in.jsonl is IN: cleaning would replace the input.*--overwrite"):
        clean_file(src, src)
    other = _write_jsonl(tmp_path / "other.jsonl", [{"text": "mine"}])
    with pytest.raises(ConfigError, match=r"OUT .*other.jsonl exists; name another OUT, or add --overwrite"):
        clean_file(src, other)
    assert open(src).read() == original and open(other).read() == '{"text": "mine"}\n'
    report = clean_file(src, src, overwrite=True)
    assert report.kept == 1 and open(src).read() == '{"text": "a plain sentence of text"}\n'
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "other.jsonl"]
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(src).st_mode & 0o777 == 0o666 & ~umask


def test_mixed_format_file_is_a_clear_error(tmp_path):
    src = _write_jsonl(tmp_path / "mixed.jsonl", [{"text": "some plain text here"},
                                                   {"chosen": "good answer", "rejected": "bad answer"}])
    with pytest.raises(DataError,
                       match=r"mixed.jsonl:2: a preference row in a file of text rows .*mixed.jsonl:1.*Split"):
        clean_file(src, str(tmp_path / "out.jsonl"))
    assert os.listdir(tmp_path) == ["mixed.jsonl"]  # neither OUT nor its temporary file


def test_unreadable_file_is_a_clear_error(tmp_path):
    """A binary line is a malformed row at its line; 1 of 2 rows = 50% > max_bad_fraction=0.1 refuses the file."""
    bad = tmp_path / "binary.jsonl"
    bad.write_bytes(b'{"text": "ok"}\n\xff\xfe\x00garbage\n')
    with pytest.raises(DataError, match=r"1 of 2 rows are malformed .*binary.jsonl:2: invalid_utf8 \(invalid UTF-8: "
                                        r"invalid start byte at byte 0xff, column 1\).* raise max_bad_fraction"):
        clean_file(str(bad), None)
    with pytest.raises(DataError, match="not found"):
        clean_file(str(tmp_path / "missing.jsonl"), None)


def test_empty_result_is_a_clear_error(tmp_path):
    src = _write_jsonl(tmp_path / "short.jsonl", [{"text": "tiny"}, {"text": "small"}])
    cfg = CleanConfig(filters=FilterConfig(min_words=5))
    with pytest.raises(DataError, match=r"short.jsonl: nothing is left after cleaning.*too_short 2.*filters.min_chars"):
        clean_file(src, str(tmp_path / "out.jsonl"), cfg)
    assert not os.path.exists(tmp_path / "out.jsonl")


def test_too_many_malformed_rows(tmp_path):
    src = _write_jsonl(tmp_path / "bad.jsonl", [{"foo": 1}, {"foo": 2}, {"text": "fine text here"}])
    with pytest.raises(DataError, match=r"2 of 3 rows are malformed.*keys \['foo'\]"):
        clean_file(src, None)


def test_example_clean_config_loads():
    from tempax.configlib import load_config

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "examples", "clean_sft.yaml")
    with open(path) as f:
        assert f.readline().startswith("#") and "tempax data clean" in f.read()
    cfg = load_config(CleanConfig, path)
    assert cfg.pii.enabled and cfg.decontaminate.eval_sets == ("../shared/data/gsm8k/test.jsonl",)


def test_rows_stream_from_the_file(tmp_path):
    """`iter_rows` yields the first rows of a gzipped JSON Lines file before reading the rest: a file whose tail is
    cut off gives its first row, then a DataError naming the file (a whole-file read would fail at once)."""
    from tempax.data.sources import iter_rows

    good = gzip.compress("".join(json.dumps({"text": f"row {i} " * 50}) + "\n" for i in range(2000)).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(good[: len(good) // 2])
    rows = iter_rows(str(path))
    assert next(rows).data == {"text": "row 0 " * 50}
    with pytest.raises(DataError, match=r"cannot read .*cut.jsonl.gz"):
        list(rows)


def test_parquet_rows_stream_in_batches(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tempax.data.sources import iter_rows, read_rows

    path = str(tmp_path / "rows.parquet")
    pq.write_table(pa.Table.from_pylist([{"text": f"document {i}"} for i in range(2500)]), path, row_group_size=1000)
    streamed = list(iter_rows(path))
    assert [(r.data, r.index) for r in streamed] == [(r.data, r.index) for r in read_rows(path)]
    assert streamed[-1].index == 2500


def test_clean_skips_a_line_that_is_not_utf8(tmp_path):
    """One line of 20 holds the byte 0xe9: cleaning skips it as malformed, names its line, keeps the other 19."""
    src = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": f"row number {i} is a plain sentence of text"}).encode() for i in range(19)]
    src.write_bytes(b"\n".join(lines[:5] + [b'{"text": "caf\xe9"}'] + lines[5:]) + b"\n")
    report = clean_file(str(src), str(tmp_path / "out.jsonl"))
    assert (report.total, report.kept, report.skipped["invalid_utf8"]) == (20, 19, 1)
    (example,) = report.examples["invalid_utf8"]
    assert example["where"] == f"{src}:6"
    assert example["text"].startswith("invalid UTF-8: invalid continuation byte at byte 0xe9")


def test_shipped_configs_write_inside_the_repository():
    """The commands that open a recipe or an example config (and the values in it) name relative paths only: an
    absolute path would send a new user's output somewhere outside their clone (a `/path/to/` placeholder for an
    input model is not a path)."""
    import glob
    import re

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = glob.glob(os.path.join(root, "examples", "*.yaml")) + glob.glob(os.path.join(root, "recipes", "**",
                                                                                          "*.yaml"), recursive=True)
    assert any(p.endswith("clean_sft.yaml") for p in paths)
    absolute = [f"{os.path.relpath(p, root)}: {m.group(0)}" for p in paths for m in
                re.finditer(r"(?<![\w.~/:-])/(?!path/to/)[A-Za-z]\S*", open(p).read())]
    assert absolute == [], absolute


def test_cleaning_a_file_counts_its_rows_under_a_labelled_bar(tmp_path, capsys, monkeypatch):
    import tempax.progress

    monkeypatch.setattr(tempax.progress, "on_terminal", lambda: True)
    src = _write_jsonl(tmp_path / "in.jsonl", [{"text": f"row number {i} is a plain sentence"} for i in range(3)])
    clean_file(src, None)
    assert "cleaning in.jsonl: 0row [" in capsys.readouterr().err
