"""Settings that are valid but almost never meant: said before training, or refused with the fix."""

from __future__ import annotations

import pytest

from tempax.errors import ConfigError
from tempax.models.config import ModelConfig
from tempax.train.config import OptimizerConfig, TrainConfig


def test_zero_learning_rate_and_a_warmup_longer_than_the_run_are_said():
    cfg = TrainConfig(steps=10, optimizer=OptimizerConfig(learning_rate=0.0))
    assert cfg.warnings() == ["train.optimizer.learning_rate=0: no trainable weight will change; the run only "
                              "measures the loss"]
    long = TrainConfig(steps=10, optimizer=OptimizerConfig(learning_rate=1e-4, warmup_steps=20))
    (warning,) = long.warnings()
    # Linear warm-up over 20 steps: the last of 10 steps uses 1e-4 * 10 / 20 = 5e-5.
    assert "warmup_steps=20 is longer than train.steps=10" in warning and "uses 5e-05" in warning
    assert TrainConfig(steps=10, optimizer=OptimizerConfig(warmup_ratio=0.5)).warnings() == []


def test_a_warmup_as_long_as_the_run_does_not_claim_the_peak_is_missed():
    """warmup_steps = steps = 4: step s uses 5e-4 * (s + 1) / 4, so the last step (s = 3) uses exactly the peak
    5e-4; the warning must not say it is never reached, only that the whole run is warm-up."""
    (warning,) = TrainConfig(steps=4, optimizer=OptimizerConfig(learning_rate=5e-4, warmup_steps=4)).warnings()
    assert warning == ("train.optimizer.warmup_steps=4 equals train.steps=4: the whole run is warm-up, so the "
                       "learning rate reaches its peak 0.0005 only at the last step and never decays; lower "
                       "train.optimizer.warmup_steps or raise train.steps")
    assert "never reaches" not in warning


def test_seq_len_beyond_the_models_positions_is_refused():
    model = ModelConfig(max_position_embeddings=64)
    TrainConfig(seq_len=64).check_model(model)
    with pytest.raises(ConfigError, match=r"train.seq_len=128 is longer than the model's max_position_embeddings=64"
                                          r".*Set train.seq_len <= 64"):
        TrainConfig(seq_len=128).check_model(model)
    TrainConfig(seq_len=128).check_model(None)  # a model without a config (a test's table model): nothing to check


def test_trainer_says_the_warnings_and_refuses_long_rows(capsys):
    from flax import nnx

    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.models.decoder import Decoder
    from tempax.models.presets import get_preset
    from tempax.train.loop import Trainer
    from tests.train.helpers import tiny_train_config

    model = Decoder(get_preset("tiny-llama").replace(max_position_embeddings=32), rngs=nnx.Rngs(0))
    said = []
    cfg = tiny_train_config(seq_len=16, optimizer=OptimizerConfig(learning_rate=0.0))
    Trainer(model, make_sft_loss(), cfg, log=said.append)
    assert said[0].startswith("warning: train.optimizer.learning_rate=0")
    with pytest.raises(ConfigError, match="max_position_embeddings=32"):
        Trainer(model, make_sft_loss(), tiny_train_config(seq_len=64), log=said.append)
