"""`score_rows`: a reward model's scores of single rows and of preference pairs (both sides), with the rows it
cannot read counted (the command around it: tests/cli/test_score.py)."""

from __future__ import annotations

import pytest
from flax import nnx

from tempax.eval.scoring import score_rows
from tempax.models.reward_model import RewardModel, load_reward_model, save_reward_model
from tempax.rewards.reward_model import RewardScorer
from tests.kit.models import tiny_tempax_model
from tests.kit.tokenizers import tiny_chat_tokenizer

SMALL = {"vocab_size": 400, "num_layers": 1, "hidden_size": 32, "num_heads": 2, "num_kv_heads": 1,
         "head_dim": 16, "intermediate_size": 64}


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory):
    tok = tiny_chat_tokenizer()
    model = RewardModel(tiny_tempax_model("llama", **SMALL), rngs=nnx.Rngs(1))
    return save_reward_model(model, str(tmp_path_factory.mktemp("score") / "rm"), tokenizer=tok.hf,
                             extra={"max_length": 64})


@pytest.fixture(scope="module")
def scorer(rm_folder):
    model, tok = load_reward_model(rm_folder)
    return RewardScorer(model, tok, max_length=64, batch_size=4)


def test_hh_dialogues_score_the_final_replies(scorer):
    """An HH-RLHF row's prompt is the shared dialogue and each side's final assistant turn is what gets scored."""
    dialogue = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Bake bread?\n\nAssistant: "
    records, report, summary = score_rows(scorer, [{"chosen": dialogue + "Mix flour.", "rejected": dialogue + "No."}])
    prompt = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
              {"role": "user", "content": "Bake bread?"}]
    assert records[0]["chosen_score"] == pytest.approx(scorer([prompt], ["Mix flour."])[0], abs=1e-5)
    assert report.kept == 1 and summary["num_pairs"] == 1
