"""tempax.configlib.help_text: `describe` lists every dotted key with its type, default and help."""

from __future__ import annotations

from tempax.configlib.help_text import describe
from tests.configlib.configs import TrainConfig


def test_describe_lists_every_dotted_key():
    text = describe(TrainConfig)
    assert "model: str (required)\n    Model id or path." in text
    assert "optimizer.learning_rate: float = 0.0003\n    Peak learning rate." in text
    assert "optimizer.name: one of 'adamw', 'sgd' = adamw" in text
    assert "lora: LoraConfig | None = null\n    LoRA adapters; null trains all weights." in text
    assert "lora.targets: tuple[str, ...] = [q_proj, v_proj]" in text
    assert "max_grad_norm: float | None = 1.0" in text
    assert "precision: one of 'float32', 'bfloat16' = float32" in text
