"""examples/grpo_gsm8k.ipynb runs top to bottom in a Jupyter kernel at its tiny size (a random-init model, a few
steps): load, warm-start, reward, GRPO, the before/after table and the reward curve, as a user would open it."""

from __future__ import annotations

import os

import nbclient
import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "examples", "grpo_gsm8k.ipynb")


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream"
                   and o.get("name") == "stdout")


@pytest.mark.slow  # compiling the three stages' programs takes over a minute on 2 cores
@pytest.mark.real_model  # the tiny size borrows SmolLM2-135M-Instruct's tokenizer from its GGUF
def test_the_grpo_notebook_runs_top_to_bottom_at_tiny_size(tmp_path, monkeypatch):
    monkeypatch.setenv("TEMPAX_NOTEBOOK_SIZE", "tiny")
    monkeypatch.setenv("TEMPAX_NOTEBOOK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # the kernel sees one CPU device, as a user's does
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": ROOT}}).execute()
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(not any(o.get("output_type") == "error" for o in c.outputs) for c in code)
    table = next(_text(c) for c in code if "GSM8K test, first" in _text(c)).splitlines()
    assert table[0] == "GSM8K test, first 4 problems, greedy:" and table[1].startswith("stage")
    assert [line[:10] for line in table[3:6]] == ["base model", "after SFT ", "after GRPO"]
    assert all(line.split()[-2] == "4" for line in table[3:6])  # problems scored per stage
    assert table[6].startswith("after GRPO minus after SFT, answers: ") and "95% CI" in table[6]
    assert os.path.getsize(tmp_path / "run" / "reward_curve.png") > 0
    assert sum(1 for _ in open(tmp_path / "run" / "sft_examples.jsonl")) == 16
    assert os.path.isfile(tmp_path / "run" / "grpo" / "metrics.jsonl")
