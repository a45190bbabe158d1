"""The trainer view: `Trainer` provides every member of `TrainerView` with the trainer's own values, and the batch
sources and hooks of tempax read nothing of a trainer beyond it (read from the source with `ast`)."""

from __future__ import annotations

import ast
import os

import numpy as np

from tempax.algorithms.sft.main import make_sft_loss
from tempax.train.config import OptimizerConfig
from tempax.train.loop import Trainer
from tempax.train.view import TrainerView
from tests.train.helpers import TableLM, tiny_train_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEMBERS = {name for name in vars(TrainerView) if not name.startswith("_")}


def test_the_trainer_provides_the_view_with_its_own_values(tmp_path, capsys):
    """batch 4 of micro-batches of 2, seq_len 16, seed 3, peak learning rate 0.25: the view's settings are those
    of `train`, its weights the state's (the same arrays, not copies), `write` prints the message."""
    cfg = tiny_train_config(tmp_path, batch_size=4, micro_batch_size=2, seq_len=16, seed=3,
                            optimizer=OptimizerConfig(learning_rate=0.25, schedule="constant"))
    trainer = Trainer(TableLM(np.zeros((16, 16))), make_sft_loss(), cfg)
    assert isinstance(trainer, TrainerView)
    assert MEMBERS <= set(dir(trainer))
    assert (trainer.batch_size, trainer.micro_batch_size, trainer.seq_len, trainer.seed, trainer.learning_rate) == \
        (4, 2, 16, 3, 0.25)
    assert trainer.step == 0 and trainer.run_dir == str(tmp_path) and trainer.full_finetune
    assert trainer.params is trainer.state.params and set(trainer.params) == {"table"}
    assert trainer.loss_fn is not None and trainer.parts.merge(trainer.params, trainer.rest) is not None
    trainer.write("a message for the console")
    assert capsys.readouterr().out == "a message for the console\n"


def _modules_given_the_view() -> dict[str, ast.Module]:
    """Every module of tempax that imports `tempax.train.view` (those that define sources or hooks)."""
    out = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "tempax")):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path.endswith(os.path.join("train", "view.py")):
                continue
            tree = ast.parse(open(path).read(), path)
            if any(isinstance(n, ast.ImportFrom) and n.module == "tempax.train.view" for n in ast.walk(tree)):
                out[os.path.relpath(path, ROOT)] = tree
    return out


def test_sources_and_hooks_read_only_the_view():
    """In a module that takes the view, every attribute read of `trainer`, `self.trainer` or `info.trainer` is a
    member of `TrainerView`: a source or hook that needs more of the trainer must widen the view, in one place."""
    modules = _modules_given_the_view()
    assert {os.path.join("tempax", "train", "hooks.py"), os.path.join("tempax", "algorithms", "grpo",
                                                                      "source.py")} <= set(modules)
    wrong = []
    for path, tree in sorted(modules.items()):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            is_trainer = (isinstance(owner, ast.Name) and owner.id == "trainer") or (
                isinstance(owner, ast.Attribute) and owner.attr == "trainer")
            if is_trainer and node.attr not in MEMBERS:
                wrong.append(f"{path}:{node.lineno} reads trainer.{node.attr}")
    assert not wrong, "reads beyond the trainer view (tempax.train.view.TrainerView):\n" + "\n".join(wrong)
