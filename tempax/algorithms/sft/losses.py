"""Supervised fine-tuning and distillation losses: pure functions of logits, targets and masks.

Both losses return `(scalar_loss, metrics)`; metrics are float32 arrays (scalars unless the key says
`per_example`). Sums and counts are reported alongside means so a train step that accumulates micro-batches can
recombine them exactly (the mean of micro-batch means is not the batch mean when token counts differ).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tempax.errors import ConfigError
from tempax.models.logprobs import masked_mean, masked_sum, token_logprobs

SFT_NORMALIZATIONS = ("tokens", "sequences")
DISTILLATION_KINDS = ("forward_kl", "reverse_kl", "jsd")


def causal_lm_loss(
    logits_btv: jax.Array,
    targets_bt: jax.Array,
    loss_mask_bt: jax.Array,
    *,
    normalize: str = "tokens",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Negative log-likelihood of the targets at masked positions (maximum-likelihood language modelling).

        nll_t = -log p(y_t | y_<t)
        normalize='tokens':    L = sum_{b,t} m_bt nll_bt / sum_{b,t} m_bt
        normalize='sequences': L = mean over rows with >= 1 masked token of (sum_t m_bt nll_bt / sum_t m_bt)

    'tokens' weights every supervised token equally (long answers dominate); 'sequences' weights every example
    equally. Rows with no masked token (batch padding) are left out of both, and an all-empty batch gives 0.

    Args:
      logits_btv: [batch, time, vocab] logits; position t predicts `targets_bt[:, t]` (see
        `tempax.models.logprobs.shift_for_next_token`).
      targets_bt: [batch, time] token ids.
      loss_mask_bt: [batch, time] 1 where the target is supervised.
      normalize: 'tokens' or 'sequences'.

    Returns:
      (loss, metrics) with metrics `loss`, `nll_sum` (sum of masked nll), `num_tokens`, `num_sequences` (rows with
      a supervised token), `token_accuracy` (argmax == target over masked positions) and `per_example_loss`
      ([batch] mean nll per row, 0 for empty rows).
    """
    if normalize not in SFT_NORMALIZATIONS:
        raise ConfigError(f"unknown SFT loss normalization {normalize!r}; choose one of {SFT_NORMALIZATIONS}")
    nll_bt = -token_logprobs(logits_btv, targets_bt)
    mask = loss_mask_bt.astype(jnp.float32)
    tokens_b = jnp.sum(mask, axis=-1)
    per_example = masked_mean(nll_bt, mask, axis=-1)
    has_tokens_b = (tokens_b > 0).astype(jnp.float32)
    num_sequences = jnp.sum(has_tokens_b)
    if normalize == "tokens":
        loss = masked_mean(nll_bt, mask)
    else:
        loss = jnp.sum(per_example * has_tokens_b) / jnp.maximum(num_sequences, 1.0)
    correct_bt = (jnp.argmax(logits_btv, axis=-1) == targets_bt).astype(jnp.float32)
    metrics = {
        "loss": loss,
        "nll_sum": masked_sum(nll_bt, mask),
        "num_tokens": jnp.sum(tokens_b),
        "num_sequences": num_sequences,
        "token_accuracy": masked_mean(correct_bt, mask),
        "per_example_loss": per_example,
    }
    return loss, metrics


def _kl_per_token(log_p_btv: jax.Array, log_q_btv: jax.Array) -> jax.Array:
    """KL(p || q) = sum_v p(v) (log p(v) - log q(v)), treating 0 * log 0 as 0."""
    p = jnp.exp(log_p_btv)
    # Where p = 0 (a -inf logit) the log difference may be -inf or NaN; zero it before the product so the
    # gradient stays finite too.
    log_diff = jnp.where(p > 0, log_p_btv - log_q_btv, 0.0)
    return jnp.sum(p * log_diff, axis=-1)


def distillation_loss(
    student_logits_btv: jax.Array,
    teacher_logits_btv: jax.Array,
    mask_bt: jax.Array,
    *,
    kind: str = "forward_kl",
    temperature: float = 1.0,
    jsd_beta: float = 0.5,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-level divergence between teacher and student next-token distributions, mean over masked tokens.

    With p_T = softmax(teacher/tau), p_S = softmax(student/tau) at each position:

        forward_kl: KL(p_T || p_S) = sum_v p_T (log p_T - log p_S)       (Hinton et al. 2015, "Distilling the
                    knowledge in a neural network"; mass-covering)
        reverse_kl: KL(p_S || p_T) = sum_v p_S (log p_S - log p_T)       (mode-seeking, as in MiniLLM, Gu et al.
                    2024)
        jsd:        beta KL(p_T || M) + (1 - beta) KL(p_S || M),  M = beta p_T + (1 - beta) p_S
                    (generalized JSD of Agarwal et al. 2024, "On-policy distillation of language models: learning
                    from self-generated mistakes" (GKD); beta = 0.5 is the symmetric Jensen-Shannon divergence)

    Deliberately different from Hinton et al.: no tau^2 factor is applied; multiply the loss yourself if you
    want gradient magnitudes independent of tau. The teacher is not stop-gradiented here; pass teacher logits
    from a frozen model (or wrap them in `jax.lax.stop_gradient`).

    Args:
      student_logits_btv, teacher_logits_btv: [batch, time, vocab] logits over the same vocabulary.
      mask_bt: [batch, time] 1 at positions that count.
      kind: 'forward_kl', 'reverse_kl' or 'jsd'.
      temperature: tau > 0, applied to both sets of logits.
      jsd_beta: the teacher's weight in the mixture M, strictly between 0 and 1 (at 0 or 1 the divergence is
        identically 0).

    Returns:
      (loss, metrics) with `loss`, `num_tokens`, and `per_example_loss` ([batch] masked mean per row).
    """
    if kind not in DISTILLATION_KINDS:
        raise ConfigError(f"unknown distillation loss {kind!r}; choose one of {DISTILLATION_KINDS}")
    log_s = jax.nn.log_softmax(student_logits_btv.astype(jnp.float32) / temperature, axis=-1)
    log_t = jax.nn.log_softmax(teacher_logits_btv.astype(jnp.float32) / temperature, axis=-1)
    if kind == "forward_kl":
        div_bt = _kl_per_token(log_t, log_s)
    elif kind == "reverse_kl":
        div_bt = _kl_per_token(log_s, log_t)
    else:
        if not 0.0 < jsd_beta < 1.0:
            raise ConfigError(f"jsd_beta must be strictly between 0 and 1, got {jsd_beta}")
        # log M computed as a logsumexp of the two weighted log-probabilities: no exp/log round trip.
        log_m = jnp.logaddexp(jnp.log(jsd_beta) + log_t, jnp.log1p(-jsd_beta) + log_s)
        div_bt = jsd_beta * _kl_per_token(log_t, log_m) + (1.0 - jsd_beta) * _kl_per_token(log_s, log_m)
    mask = mask_bt.astype(jnp.float32)
    loss = masked_mean(div_bt, mask)
    metrics = {
        "loss": loss,
        "num_tokens": jnp.sum(mask),
        "per_example_loss": masked_mean(div_bt, mask, axis=-1),
    }
    return loss, metrics
