"""tempax's KTO loss and gradients against TRL's `KTOTrainer` (the pinned version) on identical inputs.

The same four unpaired rows (three desirable, one undesirable), each with its mismatched KL row, the same
precomputed reference log-probs and the same policy: a bigram language model, logits of a token = row W[token] of
one hand-written [V, V] matrix, built once in JAX and once in PyTorch. tempax computes the loss with `KTOLoss` on
its stacked batch (`kto_items` + `collate_annotated`, the reference read from the batch); TRL with
`KTOTrainer._compute_loss` itself, on the batch its own collator makes, with precomputed reference log-probs.
The mismatched rows are TRL's: row i's KL completion is row i-1's completion (row 0 takes the last one), as its
dataset preparation builds them within a batch.

What the two must agree on, to 1e-5: the loss, its gradient with respect to W (which also checks that neither
side differentiates through the KL reference point: the KL rows are scored by the same W), the KL estimate
z_0 = max(0, mean_i [log pi(y'_i|x_i) - log ref(y'_i|x_i)]) and the mean implicit rewards of each kind. Three
settings: z_0 > 0; z_0 clamped at 0 (the reference gives the KL rows a higher log-prob than the policy);
unequal weights lambda_D = 1.0, lambda_U = 1.33 at beta = 0.5.
"""

from __future__ import annotations

from collections import defaultdict
from types import MethodType, SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tempax.algorithms.preference.batches import REF_LOGPS, collate_annotated
from tempax.algorithms.preference.kto import KTOLoss, kto_items
from tempax.data.formats import Example
from tempax.data.unpaired import UnpairedExample

pytestmark = pytest.mark.needs_torch

torch = pytest.importorskip("torch")
kto_trainer = pytest.importorskip("trl.trainer.kto_trainer")

VOCAB = 8
PAD = 0
# (prompt ids, completion ids, desirable); token 0 is padding and never appears in a row.
ROWS = (
    ([1, 2, 3], [4, 5], True),
    ([2, 6], [7, 3, 1], False),
    ([5, 1, 4], [6], True),
    ([3, 7], [2, 2, 5, 6], True),
)
# Reference log-probs of each row's own completion, as a reference model would have given them.
REF_LOGPS_OWN = (-4.0, -6.5, -2.5, -9.0)


def bigram_logits_table() -> np.ndarray:
    """W[i, j] = 0.3 * ((3i + 5j) mod 7) - 0.9: every entry in [-0.9, +0.9], no two rows alike."""
    i, j = np.meshgrid(np.arange(VOCAB), np.arange(VOCAB), indexing="ij")
    return (0.3 * ((3 * i + 5 * j) % 7) - 0.9).astype(np.float32)


def kl_completions() -> list[list[int]]:
    """TRL's mismatched completions: row i gets row i-1's, row 0 the last row's."""
    completions = [c for _, c, _ in ROWS]
    return completions[-1:] + completions[:-1]


def bigram_logps(table: np.ndarray, prompt: list[int], completion: list[int]) -> float:
    """Summed log-prob of `completion` after `prompt` under the bigram model (for building reference values)."""
    ids = prompt + completion
    log_softmax = table - np.log(np.sum(np.exp(table), axis=1, keepdims=True))
    return float(sum(log_softmax[ids[t - 1], ids[t]] for t in range(len(prompt), len(ids))))


def reference_kl_logps(table: np.ndarray, offset: float) -> list[float]:
    """Reference log-probs of the KL rows: the policy's own minus `offset`, so every mismatched log-ratio is
    +offset and z_0 = max(0, offset)."""
    return [bigram_logps(table, p, c) - offset for (p, _, _), c in zip(ROWS, kl_completions())]


class JaxBigram(nnx.Module):
    """`model(tokens, positions=, segment_ids=) -> (logits, cache)` with logits[b, t] = W[tokens[b, t]]."""

    def __init__(self, table: np.ndarray):
        self.table = nnx.Param(jnp.asarray(table))

    def __call__(self, tokens, *, positions=None, segment_ids=None):
        return self.table[...][tokens], None


def tempax_loss_and_grad(table, ref_kl, *, beta, desirable_weight, undesirable_weight):
    items = []
    for (prompt, completion, desirable), kl_completion, k in zip(ROWS, kl_completions(), range(len(ROWS))):
        own = Example(np.array(prompt + completion, np.int32),
                      np.array([False] * len(prompt) + [True] * len(completion)))
        mismatched = Example(np.array(prompt + kl_completion, np.int32),
                             np.array([False] * len(prompt) + [True] * len(kl_completion)))
        items.append(UnpairedExample(own, mismatched, desirable, f"row {k}"))
    annotated = [it.with_values(**{REF_LOGPS: (REF_LOGPS_OWN[k], ref_kl[k])}) for k, it in enumerate(kto_items(items))]
    batch = {k: jnp.asarray(v) for k, v in collate_annotated(annotated, seq_len=8, pad_id=PAD).items()}
    loss_fn = KTOLoss(beta, desirable_weight, undesirable_weight, reference="batch")
    model = JaxBigram(table)
    (loss, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch)
    return float(loss), np.asarray(grads.table[...]), {k: float(v) for k, v in metrics.items()}


class TorchBigram(torch.nn.Module):
    """The same bigram model answering the way TRL's fused LM head does: `log_probs` [B, T-1] of each label token
    (0 where the label is -100), plus the `entropy` and `mean_logits` its metrics read."""

    def __init__(self, table: np.ndarray):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table))

    def forward(self, input_ids, attention_mask=None, labels=None, fused_lm_head=True, use_cache=False):
        log_softmax = torch.log_softmax(self.table[input_ids[:, :-1]], dim=-1)  # predicts tokens 1..T-1
        targets = labels[:, 1:]
        picked = torch.gather(log_softmax, -1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        log_probs = torch.where(targets == -100, torch.zeros_like(picked), picked)
        zeros = torch.zeros_like(log_probs)
        return SimpleNamespace(log_probs=log_probs, entropy=zeros, mean_logits=zeros)


def trl_loss_and_grad(table, ref_kl, *, beta, desirable_weight, undesirable_weight):
    model = TorchBigram(table)
    model.train()
    examples = [
        {"prompt_ids": p, "completion_ids": c, "KL_completion_ids": kc, "label": d, "ref_logps": REF_LOGPS_OWN[k],
         "ref_KL_logps": ref_kl[k]}
        for k, ((p, c, d), kc) in enumerate(zip(ROWS, kl_completions()))
    ]
    inputs = kto_trainer.DataCollatorForUnpairedPreference(pad_token_id=PAD)(examples)
    accelerator = SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x)
    # The attributes `_compute_loss` reads, as `KTOTrainer.__init__` sets them for these arguments.
    trainer = SimpleNamespace(
        model=model, accelerator=accelerator, calculate_KL=True, precompute_ref_logps=True, aux_loss_enabled=False,
        loss_type="kto", beta=beta, desirable_weight=desirable_weight, undesirable_weight=undesirable_weight,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
    )
    trainer._compute_kl_logps = MethodType(kto_trainer.KTOTrainer._compute_kl_logps, trainer)
    loss = kto_trainer.KTOTrainer._compute_loss(trainer, model, inputs, False)
    loss.backward()
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items() if v}
    return float(loss), model.table.grad.numpy(), logged


@pytest.mark.parametrize(
    "offset, beta, desirable_weight, undesirable_weight",
    [(0.7, 0.1, 1.0, 1.0),      # z_0 = 0.7 > 0
     (-1.2, 0.1, 1.0, 1.0),     # mean mismatched log-ratio -1.2: z_0 clamped to 0
     (0.4, 0.5, 1.0, 1.33)],    # lambda_U > lambda_D and a larger beta
    ids=["kl-positive", "kl-clamped", "weights-and-beta"],
)
def test_kto_loss_and_gradient_equal_trl_on_the_same_batch(offset, beta, desirable_weight, undesirable_weight):
    table = bigram_logits_table()
    ref_kl = reference_kl_logps(table, offset)
    kwargs = dict(beta=beta, desirable_weight=desirable_weight, undesirable_weight=undesirable_weight)
    ours, our_grad, metrics = tempax_loss_and_grad(table, ref_kl, **kwargs)
    theirs, their_grad, logged = trl_loss_and_grad(table, ref_kl, **kwargs)
    assert abs(ours - theirs) < 1e-5, (ours, theirs)
    np.testing.assert_allclose(our_grad, their_grad, atol=1e-5, rtol=0)
    assert np.abs(their_grad).max() > 1e-3  # the gradient is not trivially zero on both sides
    assert abs(metrics["kl"] - max(offset, 0.0)) < 1e-5 and abs(logged["kl"] - max(offset, 0.0)) < 1e-5
    assert abs(metrics["desirable_reward"] - logged["rewards/chosen"]) < 1e-5
    assert abs(metrics["undesirable_reward"] - logged["rewards/rejected"]) < 1e-5
