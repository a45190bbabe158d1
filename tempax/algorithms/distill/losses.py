"""Knowledge-distillation losses: pure functions of student and teacher logits (or hidden states), targets, masks.

`token_divergence` is the per-position divergence of the student from the teacher (forward KL, reverse KL or
generalised JSD, optionally against a top-k teacher), `distillation_loss` mixes it with the label cross-entropy,
and `chunked_distillation_loss` computes the same loss from both models' hidden states without whole [B, T, V]
logits. Each docstring holds its formula and paper.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tempax.models.decoder import lm_head_of
from tempax.ops.fused_head import chunk_size, head_logits, split_chunks, unsplit_chunks
from tempax.errors import ConfigError

DIVERGENCES = ("forward_kl", "reverse_kl", "jsd")


def check_distill_args(kind: str, temperature: float, alpha: float, jsd_beta: float, top_k: int) -> None:
    """Raises `ConfigError` naming the bad hyper-parameter."""
    if kind not in DIVERGENCES:
        raise ConfigError(f"unknown distillation loss {kind!r}; choose one of {DIVERGENCES}")
    if not temperature > 0:
        raise ConfigError(f"distillation temperature must be > 0, got {temperature}")
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"distillation alpha (weight of the KD term) must lie in [0, 1], got {alpha}")
    if kind == "jsd" and not 0.0 < jsd_beta < 1.0:
        raise ConfigError(f"jsd_beta must be strictly between 0 and 1, got {jsd_beta}")
    if not isinstance(top_k, int) or top_k < 0:
        raise ConfigError(f"top_k must be an integer >= 0 (0: the teacher's whole distribution), got {top_k}")
    if top_k and kind == "reverse_kl":
        raise ConfigError(
            "reverse_kl with a top-k teacher is infinite wherever the student puts mass outside the teacher's top k; "
            "use loss.kind=forward_kl or loss.kind=jsd with loss.top_k, or loss.top_k=0"
        )


def _kl(log_p: jax.Array, log_q: jax.Array) -> jax.Array:
    """KL(p || q) = sum_v p(v) (log p(v) - log q(v)) over the last axis, with 0 log 0 = 0."""
    p = jnp.exp(log_p)
    # Where p = 0 (a -inf logit, or a token cut by top-k) the log difference may be -inf or NaN; zero it before
    # the product so the gradient stays finite too.
    return jnp.sum(p * jnp.where(p > 0, log_p - log_q, 0.0), axis=-1)


def teacher_top_k(teacher_logits: jax.Array, k: int) -> jax.Array:
    """The teacher's logits with every token below its k-th largest set to -inf (k = 0: unchanged), so that a
    softmax renormalises over the top k."""
    if not k or k >= teacher_logits.shape[-1]:
        return teacher_logits
    kth = jax.lax.top_k(teacher_logits, k)[0][..., -1:]
    return jnp.where(teacher_logits >= kth, teacher_logits, -jnp.inf)


def token_divergence(
    student_logits: jax.Array,
    teacher_logits: jax.Array,
    *,
    kind: str = "forward_kl",
    temperature: float = 1.0,
    jsd_beta: float = 0.5,
    top_k: int = 0,
) -> jax.Array:
    """D(p_T, p_S) at every position ([..., V] logits -> [...]) (no T^2; `distillation_loss` applies it).

    Per position, with p_T = softmax(z_T / T) and p_S = softmax(z_S / T) at temperature T:

        forward_kl:  D = KL(p_T || p_S) = sum_v p_T (log p_T - log p_S)       Hinton et al. 2015, "Distilling the
                     knowledge in a neural network" (mass-covering)
        reverse_kl:  D = KL(p_S || p_T) = sum_v p_S (log p_S - log p_T)       mode-seeking (MiniLLM, Gu et al. 2024)
        jsd:         D = beta KL(p_T || M) + (1 - beta) KL(p_S || M),  M = beta p_T + (1 - beta) p_S
                     generalised JSD of Agarwal et al. 2024, "On-policy distillation of language models: learning from
                     self-generated mistakes" (GKD); beta = 0.5 is the symmetric Jensen-Shannon divergence

    Top-k teacher (`top_k` = k > 0): the teacher's distribution is cut to its k most likely tokens and renormalised
    there, p_T^k(v) = p_T(v) / sum_{u in top k} p_T(u) (tokens tied with the k-th logit are kept too). The student's
    distribution stays the full softmax, so forward KL still pushes the student's mass off the other tokens and JSD
    stays finite (M > 0 wherever p_S > 0). Reverse KL with a top-k teacher is refused: KL(p_S || p_T^k) is infinite
    as soon as the student gives any probability to a token outside the teacher's top k.
    """
    z_t = teacher_top_k(teacher_logits.astype(jnp.float32), top_k)
    log_s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    log_t = jax.nn.log_softmax(z_t / temperature, axis=-1)
    if kind == "forward_kl":
        return _kl(log_t, log_s)
    if kind == "reverse_kl":
        return _kl(log_s, log_t)
    # log M as a logsumexp of the two weighted log-probabilities: no exp/log round trip.
    log_m = jnp.logaddexp(jnp.log(jsd_beta) + log_t, jnp.log1p(-jsd_beta) + log_s)
    return jsd_beta * _kl(log_t, log_m) + (1.0 - jsd_beta) * _kl(log_s, log_m)


def _token_terms(z_s, z_t, targets, kind, temperature, jsd_beta, top_k):
    """Per position: (divergence, label NLL, student argmax == teacher argmax, student argmax == label)."""
    z_s = z_s.astype(jnp.float32)
    div = token_divergence(z_s, z_t, kind=kind, temperature=temperature, jsd_beta=jsd_beta, top_k=top_k)
    lse = jax.nn.logsumexp(z_s, axis=-1)
    z_y = jnp.take_along_axis(z_s, targets[..., None].astype(jnp.int32), axis=-1, mode="clip")[..., 0]
    top_s = jnp.argmax(z_s, axis=-1)
    agree = (top_s == jnp.argmax(z_t, axis=-1)).astype(jnp.float32)
    hit = (top_s == targets).astype(jnp.float32)
    return div, lse - z_y, agree, hit


def _coefficients(mask_bt: jax.Array, alpha: float, temperature: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(KD coefficient, CE coefficient, token count): L = sum kd_c D + sum ce_c NLL is the module's L."""
    mask = mask_bt.astype(jnp.float32)
    n = jnp.sum(mask)
    per_token = mask / jnp.maximum(n, 1.0)
    return alpha * temperature**2 * per_token, (1.0 - alpha) * per_token, n


def _metrics(loss, div, nll, agree, hit, mask_bt, n) -> dict[str, jax.Array]:
    mask = mask_bt.astype(jnp.float32)
    tokens_b = jnp.sum(mask, axis=-1)

    def mean(x):
        return jnp.sum(jnp.where(mask > 0, x, 0.0)) / jnp.maximum(n, 1.0)

    return {
        "loss": loss,
        "kd_loss": mean(div),  # the divergence at temperature T, without the T^2 factor
        "ce_loss": mean(nll),
        "agreement": mean(agree),
        "token_accuracy": mean(hit),
        "num_tokens": n,
        "per_example_kd": jnp.sum(jnp.where(mask > 0, div, 0.0), axis=-1) / jnp.maximum(tokens_b, 1.0),
    }


def distillation_loss(
    student_logits_btv: jax.Array,
    teacher_logits_btv: jax.Array,
    targets_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    kind: str = "forward_kl",
    temperature: float = 1.0,
    alpha: float = 1.0,
    jsd_beta: float = 0.5,
    top_k: int = 0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """L = alpha T^2 mean_m(D) + (1 - alpha) mean_m(NLL) from whole logits, D as in `token_divergence`.

    The loss mixes D with the next-token cross-entropy on the labels (at temperature 1):

        L = alpha * T^2 * mean_m(D) + (1 - alpha) * mean_m(-log softmax(z_S)[y])

    over the positions where the mask m is 1 (a token mean). The T^2 factor is Hinton et al.'s: the gradient of D
    with respect to the logits scales like 1 / T^2, so T^2 D keeps gradient magnitudes comparable across
    temperatures. alpha = 1 is pure distillation, alpha = 0 is plain SFT (the teacher then only feeds the metrics).

    The teacher's logits are wrapped in `stop_gradient`: only the student learns.

    Args:
      student_logits_btv, teacher_logits_btv: [batch, time, vocab] logits over the same vocabulary; position t
        predicts `targets_bt[:, t]`.
      targets_bt: [batch, time] label token ids (for the cross-entropy term and token accuracy).
      mask_bt: [batch, time] 1 at positions that count.
      kind: 'forward_kl', 'reverse_kl' or 'jsd'.
      temperature: T > 0, applied to both models' logits in D (not in the cross-entropy).
      alpha: weight of the distillation term in [0, 1].
      jsd_beta: the teacher's weight in the mixture M of 'jsd', strictly between 0 and 1.
      top_k: renormalise the teacher over its k most likely tokens (0: all).

    Returns:
      (loss, metrics): `loss`, `kd_loss` (mean D, no T^2), `ce_loss` (mean label NLL), `agreement` (student
      argmax == teacher argmax), `token_accuracy` (student argmax == label), `num_tokens` (masked positions),
      `per_example_kd` ([batch] mean D per row).
    """
    check_distill_args(kind, temperature, alpha, jsd_beta, top_k)
    z_t = jax.lax.stop_gradient(teacher_logits_btv)
    div, nll, agree, hit = _token_terms(student_logits_btv, z_t, targets_bt, kind, temperature, jsd_beta, top_k)
    kd_c, ce_c, n = _coefficients(mask_bt, alpha, temperature)
    loss = jnp.sum(kd_c * div) + jnp.sum(ce_c * nll)
    return loss, _metrics(loss, div, nll, agree, hit, mask_bt, n)


# --------------------------------------------------------------------------------------------------------------
# Chunked over positions, from hidden states


@dataclass(frozen=True)
class LMHead:
    """A model's output head: logits = softcap(h W). `weight` is [V, D] when `vocab_major` (a tied embedding),
    else [D, V]; `softcap` is the final-logit soft-cap (Gemma 2) or None."""

    weight: jax.Array
    vocab_major: bool
    softcap: float | None = None

    @classmethod
    def of(cls, model: Any) -> "LMHead":
        """The head of a tempax `Decoder` in its compute dtype."""
        weight, vocab_major = lm_head_of(model)
        return cls(weight, vocab_major, model.config.final_logit_softcap)

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0 if self.vocab_major else 1])


class _Spec(NamedTuple):
    """The static part of a chunked loss (hashable: part of the jit cache key)."""

    kind: str
    temperature: float
    jsd_beta: float
    top_k: int
    chunk: int
    student_vocab_major: bool
    student_softcap: float | None
    teacher_vocab_major: bool
    teacher_softcap: float | None


def _capped(z: jax.Array, cap: float | None) -> jax.Array:
    return z if cap is None else cap * jnp.tanh(z / cap)


def _chunk_loss(spec: _Spec, h_s, w_s, h_t, w_t, targets, kd_c, ce_c):
    """One chunk: (sum kd_c D + sum ce_c NLL, per-position terms). Logits are [B, C, V] float32."""
    z_s = _capped(head_logits(h_s, w_s, spec.student_vocab_major), spec.student_softcap)
    z_t = _capped(head_logits(h_t, w_t, spec.teacher_vocab_major), spec.teacher_softcap)
    div, nll, agree, hit = _token_terms(z_s, z_t, targets, spec.kind, spec.temperature, spec.jsd_beta, spec.top_k)
    return jnp.sum(kd_c * div) + jnp.sum(ce_c * nll), (div, nll, agree, hit)


def _chunks(spec: _Spec, *arrays):
    return tuple(split_chunks(a, spec.chunk) for a in arrays)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunked(spec: _Spec, h_s, w_s, h_t, w_t, targets, kd_c, ce_c):
    """(sum of the chunk losses, div, nll, agree, hit [B, T]); only the first output is differentiable."""

    def body(total, xs):
        hc, htc, tc, kc, cc = xs
        loss, terms = _chunk_loss(spec, hc, w_s, htc, w_t, tc, kc, cc)
        return total + loss, terms

    total, terms = jax.lax.scan(body, jnp.zeros((), jnp.float32), _chunks(spec, h_s, h_t, targets, kd_c, ce_c))
    return (total, *(unsplit_chunks(t) for t in terms))


def _chunked_fwd(spec: _Spec, h_s, w_s, h_t, w_t, targets, kd_c, ce_c):
    grad_fn = jax.value_and_grad(partial(_chunk_loss, spec), argnums=(0, 1), has_aux=True)

    def body(carry, xs):
        total, dw = carry
        hc, htc, tc, kc, cc = xs
        (loss, terms), (dh, dw_c) = grad_fn(hc, w_s, htc, w_t, tc, kc, cc)
        return (total + loss, dw + dw_c.astype(jnp.float32)), (dh, *terms)

    init = (jnp.zeros((), jnp.float32), jnp.zeros(w_s.shape, jnp.float32))
    (total, dw), outs = jax.lax.scan(body, init, _chunks(spec, h_s, h_t, targets, kd_c, ce_c))
    dh, div, nll, agree, hit = (unsplit_chunks(o) for o in outs)
    residuals = (dh, dw.astype(w_s.dtype), div, nll, h_t, w_t, targets)
    return (total, div, nll, agree, hit), residuals


def _chunked_bwd(spec: _Spec, residuals, cotangents):
    dh, dw, div, nll, h_t, w_t, targets = residuals
    ct = cotangents[0]  # the per-position outputs are reported, not differentiated
    zero_targets = np.zeros(targets.shape, dtype=jax.dtypes.float0)
    return (dh * ct.astype(dh.dtype), dw * ct.astype(dw.dtype), jnp.zeros_like(h_t), jnp.zeros_like(w_t),
            zero_targets, div * ct, nll * ct)


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def chunked_distillation_loss(
    student_hidden_btd: jax.Array,
    student_head: LMHead,
    teacher_hidden_btd: jax.Array,
    teacher_head: LMHead,
    targets_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    kind: str = "forward_kl",
    temperature: float = 1.0,
    alpha: float = 1.0,
    jsd_beta: float = 0.5,
    top_k: int = 0,
    chunk_len: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`distillation_loss(student logits, teacher logits, ...)` from final hidden states, `chunk_len` positions at
    a time (the largest divisor of T not above it; `tempax.ops.fused_head.chunk_size`); None: whole rows.

    Args:
      student_hidden_btd, teacher_hidden_btd: [batch, time, hidden] final-norm hidden states of each model (their
        hidden sizes may differ).
      student_head, teacher_head: each model's `LMHead` (same vocabulary size).
      targets_bt, mask_bt, kind, temperature, alpha, jsd_beta, top_k: as in `distillation_loss`.

    Returns:
      (loss, metrics) with the keys and meaning of `distillation_loss`'s.

    Chunk by chunk over sequence positions, neither model's [B, T, V] float32 logits exist whole: inside one
    `lax.scan` each chunk's logits of both models are formed, the chunk's loss and its gradient with respect to the
    student's hidden states and head are taken locally, and only d L / d h [B, T, D] and d L / d W (the head's own
    size) are kept for the backward pass (the pattern of `tempax.ops.fused_head`, with autodiff inside the chunk
    instead of a hand-written gradient, so every divergence shares it). The teacher's inputs get no gradient.
    """
    check_distill_args(kind, temperature, alpha, jsd_beta, top_k)
    if student_head.vocab_size != teacher_head.vocab_size:
        raise ConfigError(
            f"student vocabulary ({student_head.vocab_size} tokens) and teacher vocabulary "
            f"({teacher_head.vocab_size} tokens) differ; distillation needs one shared tokenizer"
        )
    spec = _Spec(kind, float(temperature), float(jsd_beta), int(top_k), chunk_size(targets_bt.shape[1], chunk_len),
                 student_head.vocab_major, student_head.softcap, teacher_head.vocab_major, teacher_head.softcap)
    kd_c, ce_c, n = _coefficients(mask_bt, alpha, temperature)
    h_t = jax.lax.stop_gradient(teacher_hidden_btd)
    w_t = jax.lax.stop_gradient(teacher_head.weight)
    loss, div, nll, agree, hit = _chunked(spec, student_hidden_btd, student_head.weight, h_t, w_t, targets_bt, kd_c,
                                          ce_c)
    div, nll, agree, hit = (jax.lax.stop_gradient(x) for x in (div, nll, agree, hit))
    return loss, _metrics(loss, div, nll, agree, hit, mask_bt, n)
