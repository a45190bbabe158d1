"""lm-evaluation-harness against `tempax serve`: its local-completions backend scores a small multiple-choice task
(tests/serve/lm_eval_task, no download) through /v1/completions with echo and logprobs, and gets the
log-likelihoods and the accuracy a direct forward pass of the served model gives."""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import pytest

from tempax.serve import start_server
from tests.generate.conftest import peaked_tiny_model
from tests.kit.tokenizers import tiny_chat_tokenizer

TASK_DIR = os.path.join(os.path.dirname(__file__), "lm_eval_task")


def _loglikelihood(model, context: list[int], continuation: list[int]) -> float:
    ids = context + continuation
    logp = np.asarray(jax.nn.log_softmax(model(np.asarray([ids]))[0][0], axis=-1))
    return float(sum(logp[t - 1, ids[t]] for t in range(len(context), len(ids))))


@pytest.mark.slow  # lm-eval's imports (datasets, scikit-learn) and a second server's start-up
def test_lm_eval_local_completions_scores_a_task_against_tempax_serve(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm_eval = pytest.importorskip("lm_eval")  # in the test extra; importorskip keeps its import out of collection
    from lm_eval.tasks import TaskManager

    model, tokenizer = peaked_tiny_model(), tiny_chat_tokenizer()
    tokenizer.hf.save_pretrained(tmp_path / "tokenizer")  # lm-eval tokenizes with it, as with a Hub tokenizer
    for name in os.listdir(TASK_DIR):
        shutil.copy(os.path.join(TASK_DIR, name), tmp_path)
    monkeypatch.chdir(tmp_path)  # the task's data_files path is relative
    server = start_server(model, tokenizer, port=0, model_name="tiny", max_model_len=64, max_batch=4)
    server.start_in_thread()
    try:
        port = server.server_address[1]
        args = (f"model=tiny,base_url=http://127.0.0.1:{port}/v1/completions,tokenizer={tmp_path / 'tokenizer'},"
                "tokenizer_backend=huggingface,num_concurrent=2,max_retries=1")
        results = lm_eval.simple_evaluate(model="local-completions", model_args=args, tasks=["tempax_tiny_choice"],
                                          task_manager=TaskManager(include_path=str(tmp_path)), log_samples=True)
    finally:
        server.shutdown()
        server.close()
    samples = results["samples"]["tempax_tiny_choice"]
    assert len(samples) == 4
    right = 0
    for sample in samples:
        doc = sample["doc"]
        context = tokenizer.encode(doc["question"])
        # lm-eval scores " " + choice (its target delimiter) after the question, split as it splits it: the
        # whole text encoded, the question's tokens first
        expected = [_loglikelihood(model, context, tokenizer.encode(f"{doc['question']} {c}")[len(context):])
                    for c in doc["choices"]]
        got = [float(r[0][0]) for r in sample["resps"]]
        assert got == pytest.approx(expected, abs=1e-3)
        right += int(np.argmax(expected) == doc["answer"])
    assert results["results"]["tempax_tiny_choice"]["acc,none"] == pytest.approx(right / 4)
