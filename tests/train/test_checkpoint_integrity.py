"""Damaged and mismatched checkpoints: the run falls back to the newest intact step and says so in one line;
nothing of TensorStore or Orbax reaches the user."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from numpy.testing import assert_allclose

from tempax.algorithms.sft.main import make_sft_loss
from tempax.data.loader import sft_loader
from tempax.errors import CheckpointError
from tempax.train.checkpoint import CheckpointMismatch, Checkpointer, DamagedCheckpoint, describe_storage_error
from tempax.train.config import CheckpointConfig, OptimizerConfig
from tempax.train.hooks import Hook
from tempax.train.loop import Trainer
from tests.train.helpers import TableLM, random_examples, tiny_train_config

VOCAB = 16


def _loader():
    return sft_loader(random_examples(40, vocab=VOCAB, seed=3), batch_size=4, seq_len=16, pad_id=0, seed=7)


def _trainer(run_dir, vocab=VOCAB, log=None):
    cfg = tiny_train_config(
        run_dir, steps=6, batch_size=4, seq_len=16,
        optimizer=OptimizerConfig(learning_rate=0.1, schedule="cosine", warmup_steps=2),
        checkpoint=CheckpointConfig(every=1, keep=3, save_at_end=True, async_save=True),
    )
    return Trainer(TableLM(np.zeros((vocab, vocab))), make_sft_loss(), cfg, log=log)


class _Crash(Hook):
    """Stops the run with an exception at step 5, before it is logged or checkpointed (a crash mid-run)."""

    def __init__(self):
        super().__init__(every=1, at_end=False)

    def __call__(self, info):
        if info.step == 5:
            raise RuntimeError("simulated crash")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    t = _trainer(tmp_path_factory.mktemp("whole"))
    losses = t.fit(_loader()).losses
    t.close()
    return losses


def _crashed_run(run_dir):
    """Steps 1-4 with checkpoints 2, 3, 4 (keep=3); the crash comes before checkpoint 5."""
    t = _trainer(run_dir)
    with pytest.raises(RuntimeError, match="simulated crash"):
        t.fit(_loader(), hooks=[_Crash()])
    t.close()
    assert sorted(Checkpointer(os.path.join(run_dir, "checkpoints")).all_steps()) == [2, 3, 4]


def _resume(run_dir):
    said = []
    t = _trainer(run_dir, log=said.append)
    result = t.fit(_loader())
    t.close()
    return result, said


def _truncate_params_file(run_dir):
    files = glob.glob(os.path.join(run_dir, "checkpoints", "4", "params", "d", "*"))
    assert files
    with open(files[0], "r+b") as f:
        f.truncate(10)
    return files[0]


def _remove_params_metadata(run_dir):
    path = os.path.join(run_dir, "checkpoints", "4", "params", "_METADATA")
    os.remove(path)
    return path


@pytest.mark.parametrize("damage, reason", [(_truncate_params_file, "is truncated: 10 bytes on disk, "),
                                            (_remove_params_metadata, "is missing")])
def test_damaged_latest_checkpoint_falls_back_and_matches_the_uninterrupted_run(
        tmp_path, uninterrupted, damage, reason, capfd):
    """Checkpoint 4 damaged -> resume from 3 in one said line; steps 4-6 then equal the uninterrupted run's."""
    _crashed_run(str(tmp_path))
    damaged_file = damage(str(tmp_path))
    capfd.readouterr()
    result, said = _resume(str(tmp_path))
    skipped = [line for line in said if line.startswith("skipping checkpoint step 4:")]
    assert len(skipped) == 1 and damaged_file in skipped[0] and reason in skipped[0], said
    assert os.path.join("damaged_checkpoints", "4") in skipped[0]
    assert result.resumed_from == 3 and [s for s, _ in result.history] == [4, 5, 6]
    assert_allclose(result.losses, uninterrupted[3:], rtol=0, atol=0)
    # The damaged folder was set aside (kept for inspection) and step 4 was written again, intact.
    assert os.path.isdir(tmp_path / "damaged_checkpoints" / "4")
    Checkpointer(str(tmp_path / "checkpoints")).verify(4)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "tensorstore" not in err.lower(), err


def test_every_checkpoint_damaged_is_one_clear_error(tmp_path):
    _crashed_run(str(tmp_path))
    for step in (2, 3, 4):
        os.remove(tmp_path / "checkpoints" / str(step) / "train" / "_METADATA")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint .*train/_METADATA is missing.*new train.run_dir"):
        _resume(str(tmp_path))


def test_checkpoint_of_another_shape_gives_the_advice_and_nothing_else(tmp_path, capfd):
    """A 20-token table against a 16-token checkpoint: named before TensorStore reads a byte, so no
    'Event loop is closed' tracebacks and no Orbax hint about `strict=False`."""
    _crashed_run(str(tmp_path))
    capfd.readouterr()
    t = _trainer(str(tmp_path), vocab=20)
    with pytest.raises(CheckpointMismatch) as info:
        t.fit(_loader())
    t.close()
    msg = str(info.value)
    assert "table: saved (16, 16), model (20, 20)" in msg and "train.checkpoint.resume=false" in msg
    assert "strict" not in msg
    err = capfd.readouterr().err
    assert "Event loop is closed" not in err and "Traceback" not in err, err
    assert os.path.isdir(tmp_path / "checkpoints" / "4")  # a mismatch is not damage: nothing is moved


def test_describe_storage_error_names_the_file():
    text = ('OUT_OF_RANGE: Error reading "table/.zarray" in OCDBT database at local file "/r/params/": Error reading '
            'Byte range [0, 799) of local file "/r/params/d/7f65": Requested byte range [0, 799) is not valid for '
            'value of size 300 [tensorstore_spec=\'{"driver":"zarr"}\']')
    assert describe_storage_error(ValueError(text)) == (
        "/r/params/d/7f65", "is truncated: 300 bytes on disk, the checkpoint's index reads up to byte 799")
    gone = FileNotFoundError(2, "No such file", "/r/params/_METADATA")
    assert describe_storage_error(gone) == ("/r/params/_METADATA", "is missing")
    assert describe_storage_error(RuntimeError("boom"))[0] is None


def test_verify_reads_no_arrays_and_reports_changed_sizes(tmp_path):
    _crashed_run(str(tmp_path))
    ckpt = Checkpointer(str(tmp_path / "checkpoints"))
    ckpt.verify(4)
    meta = tmp_path / "checkpoints" / "4" / "meta" / "metadata"
    meta.write_text(meta.read_text() + " ")
    with pytest.raises(DamagedCheckpoint, match=r"meta/metadata changed size since it was saved"):
        ckpt.verify(4)
    assert ckpt.intact_steps() == [3, 2]


def _leave_unfinished(run_dir, step):
    """What a kill -9 during the save of `step` leaves: the folder under Orbax's temporary name, never renamed."""
    folder = os.path.join(run_dir, "checkpoints", str(step))
    os.rename(folder, folder + ".orbax-checkpoint-tmp-1700000000")


def test_a_resume_that_finds_only_an_unfinished_save_says_it_starts_over(tmp_path):
    """Only step 2's save was under way when the run died: the restart begins at step 0 and says why."""
    _crashed_run(str(tmp_path))
    for step in (3, 4):
        Checkpointer(str(tmp_path / "checkpoints")).set_aside(step)
    _leave_unfinished(str(tmp_path), 2)
    result, said = _resume(str(tmp_path))
    assert result.resumed_from == 0 and [s for s, _ in result.history] == [1, 2, 3, 4, 5, 6]
    assert f"{tmp_path / 'checkpoints'} holds only an unfinished save of step 2 (the run stopped while writing " \
           "it); starting again from step 0" in said


def test_a_resume_past_an_unfinished_save_names_the_dropped_step(tmp_path):
    _crashed_run(str(tmp_path))
    _leave_unfinished(str(tmp_path), 4)
    result, said = _resume(str(tmp_path))
    assert result.resumed_from == 3
    assert (f"resumed from {tmp_path / 'checkpoints' / '3'} (step 3); dropped an unfinished save of step 4 (the run "
            "stopped while writing it)") in said
