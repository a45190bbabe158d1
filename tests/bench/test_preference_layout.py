"""The shared-prompt layout's arithmetic in bench/preference_layout.py, by hand."""

import numpy as np

from bench.preference_layout import group_positions, rows_needed
from tempax.data.formats import Example


def side(tokens: list[int], trained_from: int) -> Example:
    mask = np.zeros(len(tokens), bool)
    mask[trained_from:] = True
    return Example(np.array(tokens, np.int32), mask)


def test_group_takes_the_prompt_once_and_repeats_its_last_token_per_branch():
    # prompt 1 2 3 (3 tokens), chosen reply 7 8, rejected reply 9: 5 + 4 - 3 + 1 = 7 positions,
    # [1 2 | 3 7 8 | 3 9].
    chosen, rejected = side([1, 2, 3, 7, 8], 3), side([1, 2, 3, 9], 3)
    assert group_positions(chosen, rejected) == (3, 7)


def test_the_prompt_ends_where_the_sides_first_differ():
    # The rendered replies may share a header token before the trained tokens start; it is still prompt only up
    # to the first token where the two sides differ.
    chosen, rejected = side([1, 2, 5, 7], 3), side([1, 2, 6, 9], 3)
    assert group_positions(chosen, rejected) == (2, 4 + 4 - 2 + 1)


def test_rows_needed_packs_largest_first():
    # 200 -> row 1 (184 left); 200 -> row 2 (184 left); each 150 into the first row with room.
    assert rows_needed([150, 200, 150, 200], 384) == 2
    # 300 -> row 1 (84 left); 100, 100 and 90 all into row 2 (284, 184, 94 left).
    assert rows_needed([100, 300, 90, 100], 384) == 2
    assert rows_needed([250, 250, 250], 384) == 3
    assert rows_needed([384], 384) == 1
