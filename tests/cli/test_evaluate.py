"""`tempax eval`: its options parse (the evaluation itself: tests/eval/test_evaluate.py)."""

from __future__ import annotations

from tempax.cli.main import build_parser


def test_eval_command_takes_limit():
    from tempax.cli.main import build_parser

    args = build_parser(["eval"]).parse_args(["eval", "smollm2-135m-instruct", "--limit", "7"])
    assert args.num_problems == 7
    assert "--limit" in build_parser(["eval"])._subparsers._group_actions[0].choices["eval"].format_help()


def test_eval_command_parses():
    args = build_parser().parse_args(["eval", "--model", "smollm2-135m-instruct", "--task", "arithmetic",
                                      "--samples", "4", "--ks", "1,4"])
    assert args.task == "arithmetic" and args.samples == 4 and args.ks == "1,4"
