"""`train.precision=bf16`: the step's loss and update stay close to float32's, the master weights and optimizer
state stay float32, training still lowers the loss, and a resumed bf16 run equals the uninterrupted one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from numpy.testing import assert_allclose

from tempax.algorithms.sft.main import make_sft_loss
from tempax.data.loader import sft_loader
from tempax.models.decoder import Decoder
from tempax.ops import projection_dot
from tempax.models.presets import PRESETS
from tempax.train.config import CheckpointConfig, OptimizerConfig
from tempax.train.loop import Trainer
from tests.train.helpers import host, random_batch, random_examples, tiny_train_config

# One layer, untied head: every kind of weight (embedding, norms, attention, MLP, LM head) in one cheap compile.
CFG = PRESETS["tiny-llama"].replace(num_layers=1)
SGD = OptimizerConfig(name="sgd", learning_rate=1.0, schedule="constant", weight_decay=0.0, grad_clip_norm=None)


def _trainer(precision: str, **kw) -> Trainer:
    return Trainer(Decoder(CFG, rngs=nnx.Rngs(0)), make_sft_loss(), tiny_train_config(precision=precision, **kw))


def test_bf16_step_is_close_to_float32_with_float32_masters():
    """One SGD step at lr 1 (the update is minus the gradient) from the same weights on the same batch.
    Tolerances, from bf16's 8 significant bits (relative rounding <= 2^-9 ~ 0.2% per operand, accumulated in
    float32): the loss within 0.1%, and each weight's gradient within 3% in relative L2 norm (rounding of the
    activations compounds through the layer; seen on an AVX512-BF16 CPU: loss 3e-5 relative, gradients <= 0.8%)."""
    batch = random_batch(8, 16, seed=3)
    ref, bf16 = _trainer("fp32", optimizer=SGD), _trainer("bf16", optimizer=SGD)
    before = host(ref.state.params)
    m32, m16 = host(ref.train_step(batch)), host(bf16.train_step(batch))
    assert_allclose(m16["loss"], m32["loss"], rtol=1e-3)
    p32, p16 = host(ref.state.params), host(bf16.state.params)
    for key in p32:
        g32, g16 = before[key] - p32[key], before[key] - p16[key]
        err = np.linalg.norm(g16 - g32) / max(np.linalg.norm(g32), 1e-30)
        assert err < 3e-2, (key, err)
    assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(bf16.state.params))
    # The trainer's view computes in bf16 through projection_dot; the caller's model is left as it was.
    linears = [n for _, n in nnx.iter_graph(bf16.model) if isinstance(n, nnx.Linear)]
    assert linears and all(n.dot_general is projection_dot and n.dtype == jnp.bfloat16 for n in linears)


def test_bf16_training_lowers_the_loss_like_float32_with_float32_optimizer_state():
    """AdamW at lr 1e-2 on one fixed batch for 8 steps: the loss falls below half of its starting value and
    follows float32's run within 1% at every step (seen: 4.868 -> 1.164 in both), and every
    optimizer moment stays float32."""
    batch = random_batch(8, 16, seed=5)
    adamw = OptimizerConfig(learning_rate=1e-2, schedule="constant", weight_decay=0.0)
    runs = {}
    for precision in ("fp32", "bf16"):
        trainer = _trainer(precision, optimizer=adamw)
        runs[precision] = [float(host(trainer.train_step(batch))["loss"]) for _ in range(8)]
    losses = runs["bf16"]
    assert losses[-1] < 0.5 * losses[0], losses
    assert_allclose(losses, runs["fp32"], rtol=1e-2)
    assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(trainer.state.opt_state) if jnp.ndim(v))


def test_bf16_resume_reproduces_the_uninterrupted_run(tmp_path):
    """4 bf16 steps in one go vs 2 steps, stop, resume to 4 (shuffled, packed batches): bit-identical losses
    and final float32 weights."""

    def run(run_dir, steps):
        cfg = dict(run_dir=str(run_dir), steps=steps, batch_size=4,
                   checkpoint=CheckpointConfig(every=0, save_at_end=True, async_save=False))
        trainer = _trainer("bf16", **cfg)
        # A fresh loader each time: the resumed run takes its data position from the checkpoint.
        result = trainer.fit(sft_loader(random_examples(24, seed=3), batch_size=4, seq_len=16, pad_id=0, seed=7))
        trainer.close()
        return result

    whole = run(tmp_path / "whole", 4)
    part1 = run(tmp_path / "split", 2)
    part2 = run(tmp_path / "split", 4)
    assert part2.resumed_from == 2
    assert_allclose(part1.losses + part2.losses, whole.losses, rtol=0, atol=0)
    for key, value in host(whole.state.params).items():
        assert_allclose(host(part2.state.params)[key], value, rtol=0, atol=0)
