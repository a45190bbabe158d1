"""bench/cli_startup.py's readings of a command's output (the measuring itself runs real `tempax` processes)."""

from bench.cli_startup import build_table, command_line, demo_table, first_reply_time


def test_first_reply_time_is_when_the_first_character_after_the_marker_arrived():
    """stdout "you> assistant> 84" arrived as 5 bytes at 1.0 s, 16 at 2.0 s (the marker ends at byte 16),
    18 at 3.5 s: the reply's first character (byte 17) came at 3.5 s."""
    out = b"you> assistant> 84"
    assert first_reply_time(out, [(1.0, 5), (2.0, 16), (3.5, 18)]) == 3.5
    assert first_reply_time(b"you> ", [(1.0, 5)]) is None


def test_first_reply_time_of_a_streamed_generate():
    """`generate` prints "[0] 'What?'\\n" (12 bytes) before the completion: its first character is the 13th
    byte, which arrived with the second read."""
    out = b"[0] 'What?'\n84\n\n"
    assert first_reply_time(out, [(1.0, 12), (2.5, 14), (3.0, 16)]) == 2.5
    assert first_reply_time(b"[0] 'What?'", [(1.0, 11)]) is None


def test_commands_and_table(tmp_path):
    argv, stdin = command_line("chat", str(tmp_path), "data.jsonl")
    assert argv[-2:] == ["chat", "smollm2-135m-instruct"] and stdin.endswith("\n")
    argv, _ = command_line("sft", str(tmp_path), "data.jsonl")
    assert "train.steps=2" in argv and f"train.run_dir={tmp_path}" in argv and "data.path=data.jsonl" in argv
    table = build_table([{"command": "generate", "cache": "warm", "wall_s": 9.0, "cpu_s": 8.0, "first_token_s": 5.5,
                          "peak_rss_gib": 1.0, "load_1min_after": 2.0}])
    assert table.splitlines()[-1] == "| generate | warm | 9.0 | 8.0 | 5.5 | 1.0 | 2.0 |"


def test_the_demo_table_is_read_without_its_timing_column(tmp_path):
    """The demo's rows (as `tempax.experiments.tables.interval_table` prints them) minus "training s", which varies between
    runs; lines around the table are ignored."""
    out = """step 3 loss 1.2
stage       format % [95% CI]     answer % [95% CI]  problems  training s
----------  --------------------  -----------------  --------  ----------
base          0.0 [ 0.0,   7.4]    0.0 [ 0.0,  7.4]        48           -
after SFT    64.6 [50.5,  76.6]   33.3 [21.7, 47.5]        48          41
after GRPO  100.0 [92.6, 100.0]   43.8 [30.7, 57.7]        48         112

run folder: runs/x
"""
    assert demo_table(out) == ["base 0.0 [ 0.0, 7.4] 0.0 [ 0.0, 7.4] 48",
                               "after SFT 64.6 [50.5, 76.6] 33.3 [21.7, 47.5] 48",
                               "after GRPO 100.0 [92.6, 100.0] 43.8 [30.7, 57.7] 48"]
    argv, stdin = command_line("demo", str(tmp_path), "unused")
    assert argv[-3:] == ["demo", "--run-dir", str(tmp_path)] and stdin is None
