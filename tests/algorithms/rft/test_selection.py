"""RFT's pure pieces against numbers worked out by hand: accept, dedup, cap, weights, the weighted SFT loss, and
the packing of kept completions into weighted SFT batches."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from tempax.rl.rollout import Prompt, Rollout
from tempax.algorithms.rft.losses import weighted_sft_loss
from tempax.algorithms.rft.selection import (
    accept_mask,
    cap_mask,
    completion_weights,
    dedup_mask,
    normalize_completion,
    select_completions,
)
from tempax.algorithms.rft.source import kept_examples, pack_round


def test_normalize_collapses_whitespace_and_strips():
    assert normalize_completion("  <answer>\n 7 \t</answer>\n") == "<answer> 7 </answer>"
    assert normalize_completion("a  b") == normalize_completion("a\nb")
    assert normalize_completion("a b") != normalize_completion("ab")  # removing a space is a different text


def test_accept_needs_the_threshold_and_a_stop_token():
    """rewards [[2.0, 1.2, 2.0], [0.0, 2.5, 1.99]] >= 2.0 -> [[T, F, T], [F, T, F]]; the third sample of
    problem 0 was cut at max_new_tokens, so it is rejected although its reward is 2.0."""
    rewards = np.array([[2.0, 1.2, 2.0], [0.0, 2.5, 1.99]])
    truncated = np.array([[False, False, True], [False, False, False]])
    np.testing.assert_array_equal(accept_mask(rewards, truncated, threshold=2.0),
                                  [[True, False, False], [False, True, False]])


def test_dedup_keeps_the_first_of_each_normalised_text_within_a_problem():
    """Problem 0: 'x 1' (kept), 'x  1' (same after normalising: dropped), 'y' (rejected: not accepted, so it
    neither counts nor blocks), 'y' (accepted, first accepted 'y': kept). Problem 1 may repeat problem 0's
    text: dedup is within a problem."""
    texts = [["x 1", "x  1", "y", "y"], ["x 1", "z", "z", "z"]]
    accepted = np.array([[True, True, False, True], [True, False, True, True]])
    np.testing.assert_array_equal(dedup_mask(texts, accepted),
                                  [[True, False, False, True], [True, False, True, False]])


def test_cap_keeps_the_highest_rewards_first_and_ties_in_sample_order():
    """cap 2 over candidates with rewards [1, 3, 2, 3]: 3 (j=1) and 3 (j=3) win; j=2's 2 and j=0's 1 are cut.
    A problem with one candidate keeps it; cap 0 keeps everything."""
    candidates = np.array([[True, True, True, True], [False, False, True, False]])
    rewards = np.array([[1.0, 3.0, 2.0, 3.0], [0.0, 0.0, 5.0, 0.0]])
    np.testing.assert_array_equal(cap_mask(candidates, rewards, cap=2),
                                  [[False, True, False, True], [False, False, True, False]])
    np.testing.assert_array_equal(cap_mask(candidates, rewards, cap=0), candidates)


def test_select_counts_duplicates_and_capped():
    """Problem 0: 4 accepted, 'a' twice -> 1 duplicate, 3 distinct, cap 2 -> 1 capped, kept 2.
    Problem 1: nothing accepted. accept rate 4 / 8 = 0.5, kept per problem (2 + 0) / 2 = 1.0, solved 1 / 2."""
    texts = [["a", "a ", "b", "c"], ["d", "e", "f", "g"]]
    rewards = np.array([[2.0, 2.0, 2.0, 2.0], [0.0, 1.0, 0.5, 0.0]])
    sel = select_completions(rewards, np.zeros((2, 4), bool), texts, threshold=2.0, cap=2)
    np.testing.assert_array_equal(sel.kept, [[True, False, True, False], [False] * 4])
    assert (sel.duplicates, sel.capped) == (1, 1)
    m = sel.metrics()
    assert m["rft/accept_rate"] == 0.5 and m["rft/kept_per_problem"] == 1.0
    assert m["rft/problems_solved_frac"] == 0.5 and m["rft/kept"] == 2.0


def test_weights_uniform_and_per_problem():
    """kept [[T, T, F, T], [F, T, F, F]]: uniform gives 1 per kept completion; per_problem 1/3 for each of
    problem 0's three and 1/1 for problem 1's one, so each problem's weights sum to 1."""
    kept = np.array([[True, True, False, True], [False, True, False, False]])
    np.testing.assert_array_equal(completion_weights(kept, weighting="uniform"), kept.astype(np.float32))
    w = completion_weights(kept, weighting="per_problem")
    np.testing.assert_allclose(w, [[1 / 3, 1 / 3, 0, 1 / 3], [0, 1, 0, 0]], rtol=1e-6)
    with pytest.raises(ValueError, match="weighting"):
        completion_weights(kept, weighting="bogus")


def test_weighted_sft_loss_by_hand():
    """log-probs [[-1, -2, -3], [-4, -5, -6]], mask [[0, 1, 1], [1, 0, 0]], weights [[9, 0.5, 0.5], [2, 2, 2]]:
    coefficients w*m = [[0, 0.5, 0.5], [2, 0, 0]], sum 3;
    L = (0.5*2 + 0.5*3 + 2*4) / 3 = 10.5 / 3 = 3.5. With all weights 1: (2 + 3 + 4) / 3 = 3.0, SFT's token mean."""
    logp = jnp.array([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
    mask = jnp.array([[0, 1, 1], [1, 0, 0]])
    loss, m = weighted_sft_loss(logp, mask, jnp.array([[9.0, 0.5, 0.5], [2.0, 2.0, 2.0]]))
    assert float(loss) == pytest.approx(3.5) and float(m["loss_weight"]) == pytest.approx(3.0)
    assert float(m["num_tokens"]) == 3.0
    loss1, _ = weighted_sft_loss(logp, mask, jnp.ones((2, 3)))
    assert float(loss1) == pytest.approx(3.0)
    loss0, _ = weighted_sft_loss(logp, jnp.zeros((2, 3)), jnp.ones((2, 3)))
    assert float(loss0) == 0.0


def _rollout() -> Rollout:
    """2 problems (prompt ids [5, 6] and [7]) x 2 samples x 3 tokens; lengths 2, 3, 1, 2 (pad 0 after)."""
    tokens = np.array([[[11, 12, 0], [21, 22, 23]], [[31, 0, 0], [41, 42, 0]]], np.int32)
    mask = (tokens != 0).astype(np.int32)
    z = np.zeros((2, 2), np.float32)
    return Rollout(prompts=[Prompt((5, 6), "", {}), Prompt((7,), "", {})], completion_tokens=tokens,
                   completion_mask=mask, logprobs=np.zeros(tokens.shape, np.float32), lengths=mask.sum(-1),
                   truncated=np.zeros((2, 2), bool), texts=[["", ""], ["", ""]], rewards=z, reward_parts={},
                   reward_failures={}, advantages=z, zero_spread=np.zeros(2, bool), seconds={})


def test_kept_examples_are_prompt_plus_sampled_tokens_with_the_loss_on_the_completion():
    """Kept (0, 1) and (1, 0): [5, 6, 21, 22, 23] with mask [0, 0, 1, 1, 1], and [7, 31] with mask [0, 1]."""
    kept = np.array([[False, True], [True, False]])
    out = kept_examples(_rollout(), kept, np.array([[0.0, 0.5], [2.0, 0.0]], np.float32))
    assert [e.tokens.tolist() for e, _ in out] == [[5, 6, 21, 22, 23], [7, 31]]
    assert [e.loss_mask.astype(int).tolist() for e, _ in out] == [[0, 0, 1, 1, 1], [0, 1]]
    assert [w for _, w in out] == [0.5, 2.0]


def test_pack_round_lays_out_weights_per_example():
    """Examples of 5 and 2 tokens, one pass, seq_len 8, 2 rows a batch. Pass 0's shuffle (seeded) decides the
    order; first-fit puts both in one row (7 <= 8), the second row is empty. The row's weights are 0.5 on the
    5-token example's slots and 2.0 on the 2-token one's, 0 on the padding slot; loss_mask is the examples' mask
    shifted by one (targets = next token): exactly 3 + 1 = 4 trained positions. Two passes give 2 rows, one
    batch."""
    kept = np.array([[False, True], [True, False]])
    ex = kept_examples(_rollout(), kept, np.array([[0.0, 0.5], [2.0, 0.0]], np.float32))
    (batch,) = pack_round(ex, batch_size=2, seq_len=8, pad_id=0, epochs=1, seed=0)
    assert batch["loss_mask"].sum() == 4 and batch["loss_mask"][1].sum() == 0
    row = batch["tokens"][0].tolist()
    first5 = row[:5] == [5, 6, 21, 22, 23]
    expect = [0.5] * 5 + [2.0] * 2 + [0.0] if first5 else [2.0] * 2 + [0.5] * 5 + [0.0]
    np.testing.assert_array_equal(batch["weights"][0], np.array(expect, np.float32))
    assert batch["weights"][1].sum() == 0
    (two,) = pack_round(ex, batch_size=2, seq_len=8, pad_id=0, epochs=2, seed=0)
    assert two["loss_mask"].sum() == 8
