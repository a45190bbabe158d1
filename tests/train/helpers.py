"""Shared pieces of the training-core tests: a hand-checkable table model, tiny batches, tiny configs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tempax.data.formats import Example
from tempax.train.config import CheckpointConfig, MeshConfig, OptimizerConfig, TrainConfig

LN2, LN3, LN4 = math.log(2), math.log(3), math.log(4)


class TableLM(nnx.Module):
    """logits[b, t] = table[tokens[b, t]]: a bigram table, so every loss is computable by hand."""

    def __init__(self, table):
        self.table = nnx.Param(jnp.asarray(table, jnp.float32))

    def __call__(self, tokens, *, positions=None, segment_ids=None):
        return self.table[...][tokens], None


def table_lm() -> TableLM:
    """Token 0 -> logits [0, 0, ln 2] (p = 1/4, 1/4, 1/2); tokens 1 and 2 -> [0, 0, 0] (p = 1/3 each)."""
    return TableLM([[0.0, 0.0, LN2], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def hand_batch() -> dict[str, np.ndarray]:
    """Row 0: (token 0 -> target 2, nll ln 2), (token 1 -> target 0, nll ln 3), masked position.
    Row 1: (token 0 -> target 0, nll ln 4), then two masked positions."""
    return {
        "tokens": np.array([[0, 1, 0], [0, 0, 1]], np.int32),
        "targets": np.array([[2, 0, 1], [0, 1, 2]], np.int32),
        "loss_mask": np.array([[1, 1, 0], [1, 0, 0]], np.int32),
        "positions": np.array([[0, 1, 2], [0, 1, 2]], np.int32),
        "segment_ids": np.ones((2, 3), np.int32),
    }


def random_batch(batch: int, seq: int, vocab: int = 128, seed: int = 0, *, ragged: bool = True) -> dict[str, np.ndarray]:
    """Random tokens with right padding of different lengths per row (so token counts differ per row)."""
    rng = np.random.RandomState(seed)
    tokens = rng.randint(3, vocab, (batch, seq)).astype(np.int32)
    lengths = rng.randint(seq // 3, seq + 1, batch) if ragged else np.full(batch, seq)
    seg = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    targets = np.where(seg, np.roll(tokens, -1, 1), 0).astype(np.int32)
    loss_mask = seg.copy()
    loss_mask[np.arange(batch), lengths - 1] = 0
    positions = np.where(seg, np.arange(seq)[None, :], 0).astype(np.int32)
    return {"tokens": np.where(seg, tokens, 0).astype(np.int32), "targets": targets, "loss_mask": loss_mask,
            "positions": positions, "segment_ids": seg}


def random_examples(n: int, vocab: int = 128, seed: int = 0, min_len: int = 4, max_len: int = 12) -> list[Example]:
    rng = np.random.RandomState(seed)
    out = []
    for i in range(n):
        length = rng.randint(min_len, max_len + 1)
        tokens = rng.randint(3, vocab, length).astype(np.int32)
        mask = np.ones(length, bool)
        mask[0] = False
        out.append(Example(tokens, mask, f"mem:{i}"))
    return out


def tiny_train_config(tmp_path=None, **kw) -> TrainConfig:
    base = dict(
        steps=4, batch_size=8, seq_len=16, log_every=1, progress_bar=False, tensorboard=False, check_memory=False,
        run_dir=str(tmp_path) if tmp_path is not None else "/tmp/tempax-test-run",
        mesh=MeshConfig(num_devices=1),
        optimizer=OptimizerConfig(learning_rate=1e-2, schedule="constant", weight_decay=0.0),
        checkpoint=CheckpointConfig(every=0, save_at_end=False, async_save=False),
    )
    base.update(kw)
    return TrainConfig(**base)


def host(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def one_and_eight_device_sgd_steps(cfg, tmp_path, *, seed: int = 2) -> list[tuple[dict, dict, object]]:
    """One SFT step (SGD, lr 1) of `Decoder(cfg)` on a random 8 x 16 batch, first on one device, then on 8 fake CPU
    devices (data 2 x fsdp 2 x tensor 2): for each, (metrics, updated params on the host, the trainer's state)."""
    from tempax.algorithms.sft.main import make_sft_loss
    from tempax.models.decoder import Decoder
    from tempax.train.loop import Trainer

    batch = random_batch(8, 16, seed=seed)
    sgd = OptimizerConfig(name="sgd", learning_rate=1.0, schedule="constant", weight_decay=0.0, grad_clip_norm=None)
    results = []
    for mesh in (MeshConfig(num_devices=1), MeshConfig(num_devices=8, data=2, fsdp=2, tensor=2)):
        trainer = Trainer(Decoder(cfg, rngs=nnx.Rngs(0)), make_sft_loss(),
                          tiny_train_config(tmp_path, optimizer=sgd, mesh=mesh))
        results.append((host(trainer.train_step(batch)), host(trainer.state.params), trainer.state))
    return results
