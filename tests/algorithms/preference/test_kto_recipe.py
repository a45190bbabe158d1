"""The shipped KTO recipe against the KTO paper's requirements (Ethayarajh et al. 2024).

The KL reference point z_0 is a mean over the mismatched rows of one (micro-)batch, and the paper asks for a batch of
at least 8 examples for that estimate; `train.batch_size` counts rows and every example is two of them (its
completion and its mismatched row), so the recipe needs batch_size / 2 >= 8 examples in each micro-batch. The
recipe splits preference pairs, so n_D = n_U and lambda_D n_D / (lambda_U n_U) = lambda_D / lambda_U, which the
paper keeps in [1, 4/3]. The recipe's comment promises every one of the 2 * max_rows rows once:
steps * batch_size / 2 = 2 * max_rows.
"""

from __future__ import annotations

import os

from tempax.algorithms.preference.kto import KTOConfig
from tempax.configlib import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RECIPE = os.path.join(ROOT, "recipes", "kto_smollm2_lora.yaml")


def test_the_kto_recipe_estimates_its_kl_point_on_at_least_8_examples_with_balanced_weights():
    cfg = load_config(KTOConfig, RECIPE)
    examples_per_micro_batch = cfg.train.batch_size // 2 // cfg.train.accumulation_steps
    assert examples_per_micro_batch >= 8, examples_per_micro_batch
    assert cfg.data.convert_pairs  # so n_D = n_U and the weight ratio is lambda_D / lambda_U
    assert 1.0 <= cfg.kto.desirable_weight / cfg.kto.undesirable_weight <= 4 / 3
    assert cfg.train.steps * cfg.train.batch_size // 2 == 2 * cfg.data.max_rows
