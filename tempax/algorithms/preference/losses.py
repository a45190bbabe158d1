"""Pairwise preference losses: DPO and its variants, ORPO, SimPO, the Bradley-Terry reward-model loss, and KTO
for unpaired feedback (`kto_loss`, whose inputs and metrics are described in its own docstring).

Inputs are per-sequence quantities of shape [batch]: summed log-probabilities of the response tokens
(`policy_chosen_logps` etc., from `tempax.models.logprobs.token_logprobs` + `masked_sum`), response lengths in
tokens, or scalar rewards. Every loss returns `(mean loss over the batch, metrics)` where metrics are float32
scalars averaged over the batch:

    chosen_reward, rejected_reward   the implicit reward each loss compares (defined per loss below)
    reward_margin                    chosen_reward - rejected_reward
    accuracy                         fraction of pairs with chosen_reward > rejected_reward (ties count 0)
    chosen_logps, rejected_logps     the policy log-probabilities as passed in (not for the reward-model loss)

Computation is in float32 whatever the input dtype.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from tempax.errors import ConfigError

# ORPO's odds p / (1 - p) diverge as the length-averaged probability p -> 1; cap log p just below 0.
_MAX_AVG_LOGP = -1e-6


def _f32(x: jax.Array) -> jax.Array:
    return jnp.asarray(x, dtype=jnp.float32)


def _smoothed_sigmoid_loss(logits: jax.Array, label_smoothing: float) -> jax.Array:
    """-(1 - eps) log sigmoid(x) - eps log sigmoid(-x): a binary cross-entropy with soft label 1 - eps."""
    return -(1.0 - label_smoothing) * jax.nn.log_sigmoid(logits) - label_smoothing * jax.nn.log_sigmoid(-logits)


def _pair_metrics(
    loss: jax.Array,
    chosen_reward: jax.Array,
    rejected_reward: jax.Array,
    chosen_logps: jax.Array | None,
    rejected_logps: jax.Array | None,
) -> dict[str, jax.Array]:
    metrics = {
        "loss": loss,
        "chosen_reward": jnp.mean(chosen_reward),
        "rejected_reward": jnp.mean(rejected_reward),
        "reward_margin": jnp.mean(chosen_reward - rejected_reward),
        "accuracy": jnp.mean((chosen_reward > rejected_reward).astype(jnp.float32)),
    }
    if chosen_logps is not None and rejected_logps is not None:
        metrics["chosen_logps"] = jnp.mean(chosen_logps)
        metrics["rejected_logps"] = jnp.mean(rejected_logps)
    return metrics


def _implicit_rewards(
    policy_chosen_logps: jax.Array,
    policy_rejected_logps: jax.Array,
    ref_chosen_logps: jax.Array,
    ref_rejected_logps: jax.Array,
    beta: float,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(pi_c, pi_r, beta (pi_c - ref_c), beta (pi_r - ref_r)) in float32."""
    pc, pr = _f32(policy_chosen_logps), _f32(policy_rejected_logps)
    chosen_reward = beta * (pc - _f32(ref_chosen_logps))
    rejected_reward = beta * (pr - _f32(ref_rejected_logps))
    return pc, pr, chosen_reward, rejected_reward


def dpo_loss(
    policy_chosen_logps: jax.Array,
    policy_rejected_logps: jax.Array,
    ref_chosen_logps: jax.Array,
    ref_rejected_logps: jax.Array,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Direct Preference Optimization, sigmoid loss (Rafailov et al. 2023), with conservative label smoothing.

        r_c = beta (log pi(y_c|x) - log ref(y_c|x)),  r_r = beta (log pi(y_r|x) - log ref(y_r|x))
        L   = -(1 - eps) log sigmoid(r_c - r_r) - eps log sigmoid(r_r - r_c)

    eps = `label_smoothing` is the assumed probability that a preference label is flipped (cDPO, Mitchell 2023,
    "A note on DPO with noisy preferences"); eps = 0 is plain DPO. Implicit rewards r_c, r_r are the metrics'
    chosen/rejected rewards.

    Args:
      policy_chosen_logps, policy_rejected_logps: [batch] summed response log-probs under the policy.
      ref_chosen_logps, ref_rejected_logps: [batch] the same under the frozen reference model.
      beta: KL-penalty strength (typically 0.1).
      label_smoothing: eps in [0, 0.5).
    """
    pc, pr, chosen_reward, rejected_reward = _implicit_rewards(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta
    )
    loss = jnp.mean(_smoothed_sigmoid_loss(chosen_reward - rejected_reward, label_smoothing))
    return loss, _pair_metrics(loss, chosen_reward, rejected_reward, pc, pr)


def ipo_loss(
    policy_chosen_logps: jax.Array,
    policy_rejected_logps: jax.Array,
    ref_chosen_logps: jax.Array,
    ref_rejected_logps: jax.Array,
    *,
    beta: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Identity Preference Optimization (Azar et al. 2023, "A general theoretical paradigm to understand learning
    from human preferences").

        h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r))
        L = (h - 1 / (2 beta))^2

    beta plays the role of the paper's tau: the log-ratio gap is regressed to 1/(2 tau) instead of pushed to
    infinity, so IPO does not overfit deterministic preferences. The paper writes h with summed log-probs; some
    implementations average them over tokens, which the caller can do by passing averaged log-probs.
    Metrics' rewards are beta (log pi - log ref), as in DPO.
    """
    pc, pr, chosen_reward, rejected_reward = _implicit_rewards(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta
    )
    h = (pc - _f32(ref_chosen_logps)) - (pr - _f32(ref_rejected_logps))
    loss = jnp.mean((h - 1.0 / (2.0 * beta)) ** 2)
    return loss, _pair_metrics(loss, chosen_reward, rejected_reward, pc, pr)


def hinge_loss(
    policy_chosen_logps: jax.Array,
    policy_rejected_logps: jax.Array,
    ref_chosen_logps: jax.Array,
    ref_rejected_logps: jax.Array,
    *,
    beta: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Hinge (SLiC-style) preference loss (Zhao et al. 2023, "SLiC-HF: sequence likelihood calibration with human
    feedback"), on reference-normalised log-ratios as in the DPO paper's comparison.

        L = max(0, 1 - beta h),  h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r))

    i.e. SLiC's calibration loss max(0, delta - h) with margin delta = 1/beta, scaled by beta. Differs from SLiC
    in using the reference log-ratio rather than raw policy log-probs, and in leaving out SLiC's separate
    regularisation term (add an SFT loss for that). Pairs already separated by more than 1/beta give zero
    gradient. Metrics' rewards are beta (log pi - log ref).
    """
    pc, pr, chosen_reward, rejected_reward = _implicit_rewards(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta
    )
    loss = jnp.mean(jax.nn.relu(1.0 - (chosen_reward - rejected_reward)))
    return loss, _pair_metrics(loss, chosen_reward, rejected_reward, pc, pr)


def _log_odds(avg_logp: jax.Array) -> jax.Array:
    """log(p / (1 - p)) from log p, as log p - log(-expm1(log p)), stable for p near 0 and near 1."""
    avg_logp = jnp.minimum(avg_logp, _MAX_AVG_LOGP)
    return avg_logp - jnp.log(-jnp.expm1(avg_logp))


def orpo_loss(
    policy_chosen_logps: jax.Array,
    policy_rejected_logps: jax.Array,
    chosen_lengths: jax.Array,
    rejected_lengths: jax.Array,
    *,
    lam: float,
    chosen_nll: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Odds-Ratio Preference Optimization (Hong et al. 2024, "ORPO: monolithic preference optimization without
    reference model").

        log p_c = log pi(y_c|x) / |y_c|   (length-averaged; likewise p_r)
        odds(p) = p / (1 - p)
        L_OR    = -log sigmoid(log odds(p_c) - log odds(p_r))
        L       = L_SFT + lam * L_OR,  L_SFT = NLL of the chosen response

    No reference model. L_SFT defaults to the length-averaged chosen NLL, mean_b(-log pi(y_c)/|y_c|), which is the
    paper's; pass `chosen_nll` ([batch] or scalar) to use another normalisation (it is averaged over the batch).
    The average log-prob is capped at -1e-6 so the odds stay finite when the policy is certain.
    Metrics' rewards are the log-odds log odds(p_c), log odds(p_r); extra metrics `nll`, `or_loss`,
    `log_odds_ratio`.

    Args:
      policy_chosen_logps, policy_rejected_logps: [batch] summed response log-probs under the policy.
      chosen_lengths, rejected_lengths: [batch] response lengths in tokens (>= 1).
      lam: weight of the odds-ratio term (the paper's lambda, typically 0.1 to 1).
      chosen_nll: optional SFT term replacing the default.
    """
    pc, pr = _f32(policy_chosen_logps), _f32(policy_rejected_logps)
    avg_c = pc / jnp.maximum(_f32(chosen_lengths), 1.0)
    avg_r = pr / jnp.maximum(_f32(rejected_lengths), 1.0)
    log_odds_c, log_odds_r = _log_odds(avg_c), _log_odds(avg_r)
    or_loss = jnp.mean(-jax.nn.log_sigmoid(log_odds_c - log_odds_r))
    nll = jnp.mean(-avg_c) if chosen_nll is None else jnp.mean(_f32(chosen_nll))
    loss = nll + lam * or_loss
    metrics = _pair_metrics(loss, log_odds_c, log_odds_r, pc, pr)
    metrics.update(nll=nll, or_loss=or_loss, log_odds_ratio=jnp.mean(log_odds_c - log_odds_r))
    return loss, metrics


def simpo_loss(
    policy_chosen_logps: jax.Array,
    policy_rejected_logps: jax.Array,
    chosen_lengths: jax.Array,
    rejected_lengths: jax.Array,
    *,
    beta: float,
    gamma: float,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Simple Preference Optimization (Meng et al. 2024, "SimPO: simple preference optimization with a
    reference-free reward").

        r_c = beta log pi(y_c|x) / |y_c|,  r_r = beta log pi(y_r|x) / |y_r|
        L   = -log sigmoid(r_c - r_r - gamma)

    No reference model; gamma is the target reward margin (the paper's gamma, not the gamma/beta ratio some
    implementations expose). `label_smoothing` smooths as in cDPO (0 = the paper). Metrics' rewards are r_c, r_r.

    Args:
      policy_chosen_logps, policy_rejected_logps: [batch] summed response log-probs under the policy.
      chosen_lengths, rejected_lengths: [batch] response lengths in tokens (>= 1).
      beta: reward scale (the paper uses 2.0 to 10.0).
      gamma: target margin (the paper uses 0.3 to 1.6).
    """
    pc, pr = _f32(policy_chosen_logps), _f32(policy_rejected_logps)
    chosen_reward = beta * pc / jnp.maximum(_f32(chosen_lengths), 1.0)
    rejected_reward = beta * pr / jnp.maximum(_f32(rejected_lengths), 1.0)
    loss = jnp.mean(_smoothed_sigmoid_loss(chosen_reward - rejected_reward - gamma, label_smoothing))
    return loss, _pair_metrics(loss, chosen_reward, rejected_reward, pc, pr)


def bradley_terry_loss(
    chosen_rewards: jax.Array,
    rejected_rewards: jax.Array,
    *,
    margin: jax.Array | float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Bradley-Terry pairwise loss for training a scalar reward model (Ouyang et al. 2022, InstructGPT).

        L = -log sigmoid(r_c - r_r - m)

    with an optional margin m ([batch] or scalar) demanding a larger gap for pairs rated further apart (Touvron
    et al. 2023, Llama 2). Metrics: `chosen_reward`, `rejected_reward`, `reward_margin`, `accuracy` (without the
    margin: r_c > r_r).

    Args:
      chosen_rewards, rejected_rewards: [batch] scalar rewards from the reward head.
      margin: None (0), a float, or a [batch] array.
    """
    rc, rr = _f32(chosen_rewards), _f32(rejected_rewards)
    logits = rc - rr if margin is None else rc - rr - _f32(margin)
    loss = jnp.mean(-jax.nn.log_sigmoid(logits))
    return loss, _pair_metrics(loss, rc, rr, None, None)


def kto_loss(
    policy_logps: jax.Array,
    ref_logps: jax.Array,
    policy_kl_logps: jax.Array,
    ref_kl_logps: jax.Array,
    desirable: jax.Array,
    *,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    mask: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Kahneman-Tversky Optimization (Ethayarajh et al. 2024, "KTO: model alignment as prospect theoretic
    optimization") for unpaired feedback: each row is one completion labelled desirable or undesirable.

        r_i  = log pi(y_i|x_i) - log ref(y_i|x_i)
        z_0  = max(0, mean_i [log pi(y'_i|x_i) - log ref(y'_i|x_i)])      (no gradient)
        L_i  = lambda_D (1 - sigmoid(beta (r_i - z_0)))   if y_i is desirable
               lambda_U (1 - sigmoid(beta (z_0 - r_i)))   if y_i is undesirable
        L    = sum_i m_i L_i / sum_i m_i

    z_0 is the paper's reference point, an estimate of KL(pi || ref): y'_i is a completion of *another* row paired
    with prompt x_i (a mismatched pair), so the estimate is not the row's own log-ratio. As in the paper it is
    clamped at 0 and detached: the policy cannot lower the loss by moving the reference point. It is a mean over
    this batch's real rows (mask m); with gradient accumulation each micro-batch estimates its own z_0 (the
    paper's estimate is per batch as well; TRL averages it over devices). lambda_D, lambda_U weigh the two kinds;
    the paper recommends lambda_D n_D / (lambda_U n_U) in [1, 4/3] for n_D desirable and n_U undesirable rows.

    Metrics (means over real rows of the kind named; 0 when the batch has none):
      desirable_reward, undesirable_reward   beta r_i, the implicit reward (as DPO's)
      reward_margin                          desirable_reward - undesirable_reward
      kl                                     z_0
      accuracy                               fraction of rows on the labelled side of z_0 (r > z_0 if desirable,
                                             r < z_0 if undesirable)
      desirable_logps, undesirable_logps     the policy log-probs as passed in
      num_desirable, num_undesirable         counts of real rows

    Args:
      policy_logps, ref_logps: [batch] summed completion log-probs of (x_i, y_i) under the policy / reference.
      policy_kl_logps, ref_kl_logps: [batch] the same for the mismatched (x_i, y'_i).
      desirable: [batch] 1 (or True) for a desirable completion, 0 for an undesirable one.
      beta: strength of the implicit KL penalty (the paper's beta, typically 0.1).
      desirable_weight, undesirable_weight: lambda_D, lambda_U.
      mask: [batch] 1 for real rows, 0 for padding; None: all rows are real.
    """
    p, r = _f32(policy_logps), _f32(ref_logps)
    d = _f32(desirable)
    m = jnp.ones_like(p) if mask is None else _f32(mask)
    count = jnp.maximum(jnp.sum(m), 1.0)
    kl_ratio = _f32(policy_kl_logps) - _f32(ref_kl_logps)
    z0 = jax.lax.stop_gradient(jnp.maximum(jnp.sum(m * kl_ratio) / count, 0.0))
    log_ratio = p - r
    value = jnp.where(d > 0, jax.nn.sigmoid(beta * (log_ratio - z0)), jax.nn.sigmoid(beta * (z0 - log_ratio)))
    weight = jnp.where(d > 0, desirable_weight, undesirable_weight)
    loss = jnp.sum(m * weight * (1.0 - value)) / count

    reward = beta * log_ratio
    m_d, m_u = m * (d > 0), m * (d <= 0)
    n_d, n_u = jnp.sum(m_d), jnp.sum(m_u)
    mean_d = lambda v: jnp.sum(m_d * v) / jnp.maximum(n_d, 1.0)  # noqa: E731
    mean_u = lambda v: jnp.sum(m_u * v) / jnp.maximum(n_u, 1.0)  # noqa: E731
    right_side = jnp.where(d > 0, log_ratio > z0, log_ratio < z0).astype(jnp.float32)
    metrics = {
        "loss": loss,
        "desirable_reward": mean_d(reward),
        "undesirable_reward": mean_u(reward),
        "reward_margin": mean_d(reward) - mean_u(reward),
        "kl": z0,
        "accuracy": jnp.sum(m * right_side) / count,
        "desirable_logps": mean_d(p),
        "undesirable_logps": mean_u(p),
        "num_desirable": n_d,
        "num_undesirable": n_u,
    }
    return loss, metrics


# name -> (loss function, the optional arrays of `preference_loss` it needs, in call order).
_PREFERENCE_LOSSES: dict[str, tuple[Callable[..., tuple[jax.Array, dict[str, jax.Array]]], tuple[str, ...]]] = {
    "sigmoid": (dpo_loss, ("ref_chosen_logps", "ref_rejected_logps")),
    "ipo": (ipo_loss, ("ref_chosen_logps", "ref_rejected_logps")),
    "hinge": (hinge_loss, ("ref_chosen_logps", "ref_rejected_logps")),
    "orpo": (orpo_loss, ("chosen_lengths", "rejected_lengths")),
    "simpo": (simpo_loss, ("chosen_lengths", "rejected_lengths")),
}
PREFERENCE_LOSS_NAMES = tuple(_PREFERENCE_LOSSES)


def preference_loss_needs_reference(name: str) -> bool:
    """Whether the named loss uses reference-model log-probs (so the caller can skip the reference pass)."""
    _check_name(name)
    return "ref_chosen_logps" in _PREFERENCE_LOSSES[name][1]


def _check_name(name: str) -> None:
    if name not in _PREFERENCE_LOSSES:
        raise ConfigError(f"unknown preference loss {name!r}; choose one of {', '.join(PREFERENCE_LOSS_NAMES)}")


def preference_loss(
    name: str,
    policy_chosen_logps: jax.Array,
    policy_rejected_logps: jax.Array,
    *,
    ref_chosen_logps: jax.Array | None = None,
    ref_rejected_logps: jax.Array | None = None,
    chosen_lengths: jax.Array | None = None,
    rejected_lengths: jax.Array | None = None,
    chosen_nll: jax.Array | None = None,
    **hparams: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Dispatch to a preference loss by name: 'sigmoid' (DPO), 'ipo', 'hinge', 'orpo' or 'simpo'.

    Arrays a loss does not use are ignored (so a caller may always pass what it has); arrays it needs but were
    not given raise ValueError. `hparams` go to the loss as keywords: `beta` (+ `label_smoothing`) for sigmoid,
    `beta` for ipo and hinge, `lam` for orpo, `beta`, `gamma` (+ `label_smoothing`) for simpo.

    Raises:
      ConfigError: for an unknown name.
    """
    _check_name(name)
    fn, needed = _PREFERENCE_LOSSES[name]
    given = {
        "ref_chosen_logps": ref_chosen_logps,
        "ref_rejected_logps": ref_rejected_logps,
        "chosen_lengths": chosen_lengths,
        "rejected_lengths": rejected_lengths,
    }
    missing = [key for key in needed if given[key] is None]
    if missing:
        raise ValueError(f"preference loss {name!r} needs {', '.join(missing)}")
    if name == "orpo":
        hparams = {**hparams, "chosen_nll": chosen_nll}
    return fn(policy_chosen_logps, policy_rejected_logps, *(given[key] for key in needed), **hparams)
