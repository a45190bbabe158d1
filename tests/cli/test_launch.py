"""`tempax launch`: the command is registered with its options, and a `tempax` command run under it prints its
report once (the launcher itself: tests/parallel/test_launch.py)."""

from __future__ import annotations

from tempax.cli.main import build_parser
from tempax.parallel.launch import launch


def test_the_command_is_registered():
    args = build_parser().parse_args(["launch", "--nproc", "2", "--", "tempax", "sft", "--config", "r.yaml"])
    assert args.cmd[-4:] == ["tempax", "sft", "--config", "r.yaml"] and args.nproc == 2


def test_a_tempax_command_under_launch_prints_once(capfd, tmp_path):
    """`tempax validate` run by 2 processes: its report once; an error in both, process 1's behind its rank."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# nothing\n# Run: tempax sft --config r.yaml\ncommand: sft\ntrain: {stpes: 2}\n")
    capfd.readouterr()
    launch(["tempax", "validate", str(recipe)], nproc=2, grace=5.0)
    _, err = capfd.readouterr()
    errors = [line for line in err.splitlines() if "unknown key 'train.stpes'" in line]
    # Process 0's line unprefixed; process 1's (when it printed before being stopped) behind its rank, in
    # whichever order the two processes reached stderr.
    unprefixed = [e for e in errors if not e.startswith("[process")]
    assert len(unprefixed) == 1 and unprefixed[0].startswith("tempax validate: error:"), err
    assert all(e.startswith("[process 1] tempax validate: error:") for e in errors if e not in unprefixed), err
