"""`check_recipe` (`tempax validate`) finds what the run would refuse, before any model is loaded: a misspelled reward name, a data
file whose first rows are in no format the command reads, a tokenizer folder without the chat template the run
needs, a run dir that is a file."""

from __future__ import annotations

import json
import os

import pytest

from tempax.algorithms.validate import check_recipe
from tempax.errors import ConfigError
from tests.kit.tokenizers import tiny_chat_tokenizer


def _grpo_recipe(tmp_path, rewards):
    recipe = tmp_path / "grpo.yaml"
    recipe.write_text(f"""# Run: tempax grpo --config {recipe}
command: grpo
model: {{source: "preset:tiny-llama"}}
task: {{name: arithmetic}}
rewards: {{functions: {json.dumps(rewards)}}}
train: {{run_dir: {tmp_path / "run"}, steps: 2}}
""")
    return str(recipe)


def test_a_misspelled_reward_is_refused_with_the_nearest_name(tmp_path):
    with pytest.raises(ConfigError, match=r"rewards.functions: unknown reward 'formatt'; did you mean 'format'\?"):
        check_recipe(_grpo_recipe(tmp_path, ["formatt", "correctness"]))
    with pytest.raises(ConfigError, match=r"cannot import 'no_such_module:fn'"):
        check_recipe(_grpo_recipe(tmp_path, ["no_such_module:fn"]))
    with pytest.raises(ConfigError, match=r"'model:/no/such/run': no such folder"):
        check_recipe(_grpo_recipe(tmp_path, ["model:/no/such/run"]))
    check_recipe(_grpo_recipe(tmp_path, ["format", "correctness"]))
    assert not os.path.exists(tmp_path / "run")  # validation writes nothing


def _sft_recipe(tmp_path, rows, tokenizer, run_dir=None):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(f"""# Run: tempax sft --config {recipe}
command: sft
model: {{source: "preset:tiny-llama", tokenizer: {tokenizer}}}
data: {{path: {data}}}
train: {{run_dir: {run_dir or tmp_path / "run"}, steps: 2}}
""")
    return str(recipe)


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    chat = root / "chat"
    tiny_chat_tokenizer().hf.save_pretrained(chat)
    plain = root / "plain"
    tiny_chat_tokenizer().hf.save_pretrained(plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    for name in ("chat_template.jinja", "chat_template.json"):
        if (plain / name).exists():
            (plain / name).unlink()
    return str(chat), str(plain)


MESSAGES = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def test_data_rows_in_no_known_format_are_refused(tmp_path, tokenizer_dirs):
    chat, _ = tokenizer_dirs
    check_recipe(_sft_recipe(tmp_path, [MESSAGES] * 3, chat))
    with pytest.raises(ConfigError, match=r"none of the first 2 rows of .*rows.jsonl is in a format sft reads; "
                                          r".*rows.jsonl:1: .*expected 'messages'"):
        check_recipe(_sft_recipe(tmp_path, [{"question": "q", "reply": "r"}] * 2, chat))


def test_a_tokenizer_without_chat_template_is_refused_for_chat_rows(tmp_path, tokenizer_dirs):
    chat, plain = tokenizer_dirs
    with pytest.raises(ConfigError, match=r"model.tokenizer: the tokenizer in .*plain has no chat template"):
        check_recipe(_sft_recipe(tmp_path, [MESSAGES], plain))
    check_recipe(_sft_recipe(tmp_path, [{"text": "plain text is fine"}], plain))
    with pytest.raises(ConfigError, match=r"has no tokenizer"):
        check_recipe(_sft_recipe(tmp_path, [MESSAGES], str(tmp_path)))


def test_a_run_dir_that_is_a_file_is_refused(tmp_path, tokenizer_dirs):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=r"train.run_dir=.*afile is an existing file, not a folder"):
        check_recipe(_sft_recipe(tmp_path, [MESSAGES], tokenizer_dirs[0], run_dir=afile))
