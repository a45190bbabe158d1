"""bench/compare.py's ratio table from hand-made records, and the one launcher both bench drivers use."""

import json
import sys

from bench.compare import build_table, first_error_line, main, peak_rss_gib, speed_ratio
from bench.peers import last_json_line, run_measurement

CPU = "AMD EPYC (AuthenticAMD), 2 cores, avx512f avx512_bf16"


def rec(side, workload, size, utc="2026-12-01 10:00", load=1.0, **fields):
    return {"side": side, "workload": workload, "size": size, "dtype": "float32", "host_cpu": CPU, "utc": utc,
            "load_average_before": [load, load, load], **fields}


RECORDS = [
    # interleaved as the driver runs them: tempax, peer, tempax, peer
    rec("tempax", "sft_full", "tiny", tokens_per_s=120.0, peak_rss_gib=2.0, jax="0.10.2", xla_flags="--a"),
    rec("peer", "sft_full", "tiny", tokens_per_s=100.0, peak_rss_gib=1.5, library="transformers 5.24.0 + torch 2.13.0"),
    rec("tempax", "sft_full", "tiny", tokens_per_s=100.0, peak_rss_gib=2.5, jax="0.10.2", xla_flags="--a"),
    rec("peer", "sft_full", "tiny", tokens_per_s=100.0, peak_rss_gib=1.0, library="transformers 5.24.0 + torch 2.13.0"),
    rec("tempax", "grpo_step", "tiny", s_per_step=5.0, peak_rss_mb=1536.0, mean_completion_tokens=63.5,
        utc="2026-12-01 10:30", load=3.0),
    rec("peer", "grpo_step", "tiny", s_per_step=10.0, peak_rss_gib=1.0, trl="1.16.0", load=2.0,
        mean_completion_tokens=64.0, library="transformers 5.24.0 + torch 2.13.0"),
    rec("tempax", "decode", "small", error="exit 1: Traceback (most recent call last):\n  ...\nRuntimeError: a | b\n"),
    rec("peer", "decode", "small", generated_tokens_per_s=84.6, peak_rss_gib=0.9, utc="2026-12-01 09:55"),
]


def row(table, start):
    (line,) = [line for line in table.splitlines() if line.startswith(start)]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_ratio_is_above_one_when_tempax_is_faster():
    """Throughput: 120 vs 100 tokens/s -> 120 / 100 = 1.2. Time: 5 vs 10 s/step -> 10 / 5 = 2.0."""
    assert speed_ratio(120.0, 100.0, higher_is_faster=True) == 1.2
    assert speed_ratio(5.0, 10.0, higher_is_faster=False) == 2.0


def test_table_rows_from_hand_made_records():
    """sft_full tiny: tempax repeats 120, 100 -> median 110; peer 100, 100 -> 100; ratio 110 / 100 = 1.10x;
    peak RSS is the larger repeat: max(2.0, 2.5) = 2.50 and max(1.5, 1.0) = 1.50.
    grpo_step tiny: 10 / 5 = 2.00x; tempax RSS 1536 MiB / 1024 = 1.50 GiB."""
    table = build_table(RECORDS)
    assert row(table, "| sft_full tokens/s | tiny") == [
        "sft_full tokens/s", "tiny", "110.0", "120.0, 100.0", "100.0 (PyTorch)", "100.0, 100.0", "1.10x",
        "2.50 / 1.50"]
    assert row(table, "| grpo_step s/step | tiny") == [
        "grpo_step s/step", "tiny", "5", "5", "10.0 (TRL GRPOTrainer)", "10.0", "2.00x", "1.50 / 1.00"]


def test_a_failed_measurement_shows_its_error_and_no_ratio():
    """The tempax decode record failed: its cell says the error's last line (the '|' escaped), no ratio."""
    table = build_table(RECORDS)
    assert "| error: RuntimeError: a \\| b |  | 84.6 (transformers generate) | 84.6 |  | ? / 0.90 |" in table


def test_rows_follow_workload_then_size_order_and_the_header_names_cpu_and_load():
    """Rows in METRICS order (sft_full, ..., decode, grpo_step); header: the CPU and the 1-min loads
    [1, 1, 1, 1, 3, 2, 1, 1]: min 1.00, max 3.00, median 1.00; no date (the records keep theirs)."""
    table = build_table(RECORDS)
    lines = table.splitlines()
    starts = [line.split("|")[1].strip() for line in lines if line.startswith("| ") and "workload" not in line]
    assert starts == ["sft_full tokens/s", "decode generated tokens/s", "grpo_step s/step"]
    assert lines[0] == f"CPU: {CPU}"
    assert lines[1] == "1-min load average before each measurement: 1.00 to 3.00 (median 1.00)"
    assert "2026" not in table
    assert "transformers 5.24.0 + torch 2.13.0 + TRL 1.16.0" in lines[-2] and "JAX 0.10.2" in lines[-2]
    assert lines[-1] == "grpo_step tiny mean completion tokens: tempax 63.5; peer 64.0."


def test_bf16_peer_cells_are_apart_from_float32_ones():
    bf16 = [dict(r, dtype="bf16") for r in RECORDS[:4]]
    table = build_table(RECORDS[:4] + bf16)
    assert "100.0 (PyTorch) |" in table and "100.0 (PyTorch bf16 autocast) |" in table
    assert row(table, "| sft_full bf16 tokens/s | tiny")[6] == "1.10x"


def test_helpers():
    assert peak_rss_gib({"peak_rss_mb": 512.0}) == 0.5 and peak_rss_gib({"peak_rss_gib": 7.2}) == 7.2
    assert peak_rss_gib({}) is None
    assert first_error_line("\n\nValueError: x\n\n") == "ValueError: x"
    assert first_error_line("E" * 300, width=10) == "EEEEEEE..."


def test_table_from_kept_records(tmp_path, capsys):
    path = tmp_path / "cmp.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    assert main(["--table-from", str(path)]) == 0
    assert capsys.readouterr().out.strip() == build_table(RECORDS)


def test_launcher_keeps_the_last_json_line_and_reports_failures():
    """A library's own dict-like print ("{'loss': ...}") is skipped; a failing process becomes an error record."""
    assert last_json_line('{"a": 1}\n{\'loss\': 2}\n') == {"a": 1}
    ok = run_measurement([sys.executable, "-c", "print('{\"x\": 1}'); print(\"{'y': 2}\")"], side="peer")
    assert ok["x"] == 1 and ok["side"] == "peer" and "error" not in ok
    bad = run_measurement([sys.executable, "-c", "raise SystemExit('broken input')"], side="tempax")
    assert bad["side"] == "tempax" and bad["error"].startswith("exit 1:") and "broken input" in bad["error"]
    slow = run_measurement([sys.executable, "-c", "import time; time.sleep(5)"], timeout_s=0.5)
    assert slow["error"].startswith("timed out after 0.5 s")


def test_driver_interleaves_sides_keeps_every_record_and_survives_a_failure(tmp_path, monkeypatch):
    """Two cells x 2 repeats: tempax, peer, tempax, peer per cell; the failing peer cell is a record, not a crash."""
    import bench.compare as compare

    def fake(side):
        def command(workload, size, dtype="float32"):
            if side == "peer" and workload == "decode":
                return [sys.executable, "-c", "raise SystemExit('no peer here')"]
            return [sys.executable, "-c", f"print('{{\"{compare.METRICS[workload][0]}\": 2.0}}')"]
        return command

    monkeypatch.setattr(compare, "tempax_command", fake("tempax"))
    monkeypatch.setattr(compare, "peer_command", fake("peer"))
    out = tmp_path / "raw.jsonl"
    records = compare.measure_all(["sft_full", "decode"], ["tiny"], repeats=2, out=str(out),
                                  lock=str(tmp_path / "lock"), peers=["transformers"])
    assert [(r["workload"], r["side"], r["repeat"]) for r in records] == [
        ("sft_full", "tempax", 0), ("sft_full", "peer", 0), ("sft_full", "tempax", 1), ("sft_full", "peer", 1),
        ("decode", "tempax", 0), ("decode", "peer", 0), ("decode", "tempax", 1), ("decode", "peer", 1)]
    assert [json.loads(line) for line in out.read_text().splitlines()] == records
    table = build_table(records)
    assert row(table, "| sft_full tokens/s | tiny")[6] == "1.00x"
    assert row(table, "| decode generated tokens/s | tiny")[4] \
        == "error (2 failed): exit 1: no peer here (transformers generate)"


TUNIX = "Tunix 0.1.7 (JAX 0.10.2, Flax 0.12.8)"


def test_tunix_gets_a_row_of_its_own_beside_transformers():
    """decode small: tempax 120, 110 -> 115; transformers 50 -> 115 / 50 = 2.30x; Tunix 100, 92 -> 96 ->
    115 / 96 = 1.20x, peak RSS max(1.3, 1.5) = 1.50 beside tempax's 0.98."""
    records = [rec("tempax", "decode", "small", generated_tokens_per_s=120.0, peak_rss_gib=0.98),
               rec("peer", "decode", "small", generated_tokens_per_s=50.0, peak_rss_gib=0.96),
               rec("tunix", "decode", "small", generated_tokens_per_s=100.0, peak_rss_gib=1.3, library=TUNIX),
               rec("tempax", "decode", "small", generated_tokens_per_s=110.0, peak_rss_gib=0.97),
               rec("peer", "decode", "small", generated_tokens_per_s=50.0, peak_rss_gib=0.96),
               rec("tunix", "decode", "small", generated_tokens_per_s=92.0, peak_rss_gib=1.5, library=TUNIX)]
    table = build_table(records)
    transformers, tunix = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
                           if line.startswith("| decode")]
    assert transformers[4:] == ["50.0 (transformers generate)", "50.0, 50.0", "2.30x", "0.98 / 0.96"]
    assert tunix[2:] == ["115.0", "120.0, 110.0", "96.0 (Tunix Sampler)", "100.0, 92.0", "1.20x", "0.98 / 1.50"]
    assert TUNIX in table.splitlines()[-1]


def test_without_tunix_s_environment_its_rows_say_not_run(tmp_path, monkeypatch):
    """No .venv-tunix and no TEMPAX_TUNIX_PYTHON: the Tunix side of decode is a "not run" record naming the setup
    command (no process, no figure, no ratio); sft_full has no Tunix side at all."""
    import bench.compare as compare
    import bench.peers_tunix as peers_tunix

    monkeypatch.delenv("TEMPAX_TUNIX_PYTHON", raising=False)
    monkeypatch.setattr(peers_tunix, "TUNIX_VENV", str(tmp_path / "absent"))
    monkeypatch.setattr(compare, "tempax_command", lambda w, s, d="float32": [
        sys.executable, "-c", f"print('{{\"{compare.METRICS[w][0]}\": 2.0}}')"])
    monkeypatch.setattr(compare, "peer_command", compare.tempax_command)
    records = compare.measure_all(["sft_full", "decode"], ["tiny"], repeats=1)
    assert [(r["workload"], r["side"]) for r in records] == [
        ("sft_full", "tempax"), ("sft_full", "peer"), ("decode", "tempax"), ("decode", "peer"), ("decode", "tunix")]
    assert records[-1]["not_run"] == "no Tunix environment: `bash scripts/setup.sh --tunix`"
    tunix = row(build_table(records), "| decode generated tokens/s | tiny | 2 | 2 | not run")
    assert tunix[4:] == ["not run (no Tunix environment: `bash scripts/setup.sh --tunix`) (Tunix Sampler)", "", "",
                         "? / ?"]


def test_tunix_runs_with_the_python_named_for_it(monkeypatch):
    import bench.compare as compare

    monkeypatch.setenv("TEMPAX_TUNIX_PYTHON", "/opt/tunix/bin/python")
    (tempax, _), (peer, _), (tunix, command) = [
        (side, c) for side, c in compare.side_commands("decode", "small", "float32", ["transformers", "tunix"])]
    assert (tempax, peer, tunix) == ("tempax", "peer", "tunix")
    assert command[0] == "/opt/tunix/bin/python" and command[1].endswith("bench/peers_tunix.py")
    assert command[2:] == ["--one", "decode", "small"]
    assert [side for side, _ in compare.side_commands("decode", "small", "float32", ["tunix"])] == [
        "tempax", "tunix"]


def test_tunix_gets_the_workload_prompts_as_text_that_encodes_back_to_them():
    """The word-level texts handed to Tunix's Sampler are bench/decode.py's prompt ids, BOS first."""
    from bench.decode import workload_prompts
    from bench.peers import SHARED, load_spec
    from bench.peers_tunix import prompt_texts
    from tempax.models.tokenizer import load_tokenizer

    spec = load_spec()
    vocab = spec["models"]["tiny"]["vocab_size"]
    ids = workload_prompts(spec, vocab)
    tokenizer = load_tokenizer(f"{SHARED}/tokenizers/wordlevel_{vocab}")
    assert [tokenizer.encode(t) for t in prompt_texts(ids)] == ids


def test_a_measuring_run_appends_its_table_to_the_page_under_its_cpu_class(tmp_path, monkeypatch):
    """Two runs -> the page's introduction and its "Runs appended" section once, then two runs in run order, each
    headed by the class and what it measured (workloads in METRICS order, then sizes), with the command and the
    table; --table-from writes nothing."""
    import bench.compare as compare

    page = tmp_path / "performance.md"
    monkeypatch.setattr(compare, "measure_all", lambda *a, **k: RECORDS)
    monkeypatch.setattr("tempax.runtime.host.cpu_info", lambda: {"flags": ["avx2", "fma"]})
    assert main(["--sizes", "tiny", "--page", str(page)]) == 0
    assert main(["--sizes", "small", "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Speed against the peers, per CPU class") and text.count("# Speed") == 1
    assert text.count("\n## Runs appended by the benchmarks\n") == 1
    sections = text.split("\n### ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["AVX2: sft_full, decode, grpo_step at tiny, small"] * 2
    assert "`python bench/compare.py --sizes tiny`" in sections[0]
    assert "`python bench/compare.py --sizes small`" in sections[1]
    assert build_table(RECORDS) in sections[0]
    kept = tmp_path / "kept.jsonl"
    kept.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    main(["--table-from", str(kept), "--page", str(page)])
    assert page.read_text() == text


def test_cpu_classes():
    from tempax.runtime.host import cpu_class

    assert cpu_class({"flags": ["avx2", "fma", "avx512f", "amx_tile", "amx_bf16"]}) == "AVX-512 + AMX"
    assert cpu_class({"flags": ["avx2", "fma", "avx512f", "avx512_bf16"]}) == "AVX-512"
    assert cpu_class({"flags": ["avx2", "fma"]}) == "AVX2"
    assert cpu_class({"flags": []}) == "older than AVX2"


def test_the_recorded_command_leaves_out_this_machines_files():
    from bench.compare import repeatable_command

    argv = ["--sizes", "tiny", "--out", "/tmp/x.jsonl", "--lock=/tmp/l", "--page", "p.md", "--repeats", "1"]
    assert repeatable_command("bench/compare.py", argv) == "python bench/compare.py --sizes tiny --repeats 1"


def test_an_imitated_instruction_set_is_named_in_the_heading():
    from bench.compare import imitated_class

    assert imitated_class("AVX-512", "--xla_foo=1", None) == "AVX-512"
    assert imitated_class("AVX-512", "--a --xla_cpu_max_isa=AVX2", "avx2") \
        == "AVX2 imitated on AVX-512 (--xla_cpu_max_isa=AVX2, ATEN_CPU_CAPABILITY=avx2)"
    assert imitated_class("AVX-512", "--xla_cpu_max_isa=avx2", None).endswith("PyTorch not limited)")
