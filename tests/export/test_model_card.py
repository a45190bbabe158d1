"""The model card: read from what a run left in its directory and from the algorithm's record (its method in
words, the knobs sections whose values it lists), without loading a model (exporting a trained run with its card:
tests/cli/test_export_card.py)."""

from __future__ import annotations

import os

import pytest

from tempax.algorithms.registry import algorithms
from tempax.configlib import dump_yaml, load_config
from tempax.export.model_card import gather, gguf_metadata, readme

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_model_card_lists_the_knobs_its_record_names(tmp_path):
    """An RFT run's card carries its `rft.*` settings (a hand-kept list of sections once left RFT out)."""
    from tempax.algorithms.rft.config import RFTConfig

    cfg = load_config(RFTConfig, os.path.join(ROOT, "recipes", "rft_arithmetic_smollm2.yaml"), command="rft")
    (tmp_path / "config.yaml").write_text(dump_yaml(cfg, command=None))
    card = gather(source="smollm2-135m-instruct", run_dir=str(tmp_path))
    assert card.algorithm == "rft"
    assert card.hyperparameters["rft.group_size"] == cfg.rft.group_size
    assert not [k for k in card.hyperparameters if k.startswith(("grpo.", "ppo."))]


def test_the_card_of_a_run_saved_under_old_key_names_reads_them_under_the_new_ones(tmp_path):
    """A run whose config.yaml predates a rename (rft.samples_per_problem, eval.num_samples) is still an RFT run,
    and its card lists the setting under the name a recipe uses now."""
    from tempax.algorithms.rft.config import RFTConfig
    from tempax.configlib import read_yaml

    cfg = load_config(RFTConfig, os.path.join(ROOT, "recipes", "rft_arithmetic_smollm2.yaml"), command="rft")
    old_names = dump_yaml(cfg, command=None).replace("  group_size:", "  samples_per_problem:", 1)  # rft: first
    (tmp_path / "config.yaml").write_text(old_names.replace("  group_size:", "  num_samples:", 1))  # then eval
    assert "samples_per_problem" in read_yaml(tmp_path / "config.yaml")["rft"]
    card = gather(source="smollm2-135m-instruct", run_dir=str(tmp_path))
    assert card.algorithm == "rft" and card.hyperparameters["rft.group_size"] == cfg.rft.group_size
    assert "rft.samples_per_problem" not in card.hyperparameters


@pytest.mark.parametrize("recipe", ["sft_lora_smollm2.yaml", "dpo_smollm2_lora.yaml", "grpo_gsm8k_smollm2.yaml",
                                    "distill_smollm2.yaml"])
def test_the_card_describes_the_method_in_its_records_words(recipe, tmp_path):
    """The README's Training section and the GGUF's `general.training.method` quote the record's `card`, for
    whichever algorithm the run's config.yaml is (the card keeps no text of its own per algorithm)."""
    from tempax.configlib import recipe_command

    command = recipe_command(os.path.join(ROOT, "recipes", recipe))
    cfg = load_config(algorithms()[command].config_class(), os.path.join(ROOT, "recipes", recipe), command=command)
    (tmp_path / "config.yaml").write_text(dump_yaml(cfg, command=None))
    card = gather(source="smollm2-135m-instruct", run_dir=str(tmp_path))
    assert card.algorithm == command and card.method == algorithms()[command].card
    assert f"- algorithm: `{command}`\n- method: {card.method}\n" in readme(card)
    assert gguf_metadata(card)["general.training.method"] == card.method
