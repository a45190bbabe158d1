"""`tempax eval`: its options parse (the evaluation itself: tests/eval/test_evaluate.py)."""

from __future__ import annotations

from tempax.cli.main import build_parser, main


def test_eval_command_takes_limit():
    from tempax.cli.main import build_parser

    args = build_parser(["eval"]).parse_args(["eval", "smollm2-135m-instruct", "--limit", "7"])
    assert args.num_problems == 7
    assert "--limit" in build_parser(["eval"])._subparsers._group_actions[0].choices["eval"].format_help()


def test_eval_command_parses():
    args = build_parser().parse_args(["eval", "--model", "smollm2-135m-instruct", "--task", "arithmetic",
                                      "--samples", "4", "--ks", "1,4"])
    assert args.task == "arithmetic" and args.samples == 4 and args.ks == "1,4"


def test_a_bad_flag_is_named_as_the_flag_typed(capsys):
    """`--max-new-tokens 0` was refused as "max_new_tokens must be >= 1": the option record's field, not the flag."""
    assert main(["eval", "smollm2-135m-instruct", "--max-new-tokens", "0"]) == 2
    assert capsys.readouterr().err == "tempax eval: error: --max-new-tokens must be >= 1, got 0\n"
    assert main(["eval", "smollm2-135m-instruct", "--batch-size", "0"]) == 2
    assert capsys.readouterr().err == "tempax eval: error: --batch-size must be >= 1, got 0\n"
