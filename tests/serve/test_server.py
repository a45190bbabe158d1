"""`tempax serve` on loopback, driven by the `openai` client: concurrent requests batched together and each equal to
the same request run alone, streaming, /v1/models, and OpenAI-shaped errors for malformed and over-long requests."""

from __future__ import annotations

import http.client
import json
import threading

import openai
import pytest

from tempax.generate import SamplingConfig, generate
from tempax.serve import start_server
from tests.generate.conftest import peaked_tiny_model
from tests.kit.tokenizers import tiny_chat_tokenizer

CONTEXT = 96


@pytest.fixture(scope="module")
def served():
    model, tokenizer = peaked_tiny_model(), tiny_chat_tokenizer()
    server = start_server(model, tokenizer, port=0, model_name="tiny", max_model_len=CONTEXT, chunk=4)
    server.start_in_thread()
    port = server.server_address[1]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=300)
    yield client, model, tokenizer, server, port
    server.shutdown()
    server.close()


def _alone(model, tokenizer, content, **knobs):
    """The same request through `generate` on its own."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=True)
    return generate(model, tokenizer, [ids], SamplingConfig(**knobs))


def _post(port, path, raw: bytes):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_models_lists_the_served_model(served):
    client = served[0]
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_concurrent_requests_share_a_batch_and_each_equals_its_request_alone(served):
    """A long request starts a batch; four sent while it decodes (greedy and sampled, different max_tokens and
    seeds) run as later batches of several rows, and each answer is what that request gives alone."""
    client, model, tokenizer, server, _ = served
    requests = [dict(content="hello there", temperature=0.0, max_tokens=40)] + [
        dict(content=f"question {i}", temperature=0.0 if i % 2 else 0.9, top_p=0.9, seed=i, max_tokens=5 + 3 * i)
        for i in range(4)
    ]
    answers: dict[int, object] = {}

    def ask(i):
        r = requests[i]
        answers[i] = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": r["content"]}], temperature=r["temperature"],
            top_p=r.get("top_p", 1.0), seed=r.get("seed", 0), max_tokens=r["max_tokens"])

    before = len(server.batcher.batch_rows)
    first = threading.Thread(target=ask, args=(0,))
    first.start()
    while len(server.batcher.batch_rows) == before:  # the long request is in the worker
        threading.Event().wait(0.01)
    rest = [threading.Thread(target=ask, args=(i,)) for i in range(1, len(requests))]
    for t in rest:
        t.start()
    for t in [first, *rest]:
        t.join()
    batches = list(server.batcher.batch_rows)[before:]
    assert batches[0] == 1 and sum(batches) == len(requests) and max(batches[1:]) >= 2, batches
    for i, r in enumerate(requests):
        alone = _alone(model, tokenizer, r["content"], max_new_tokens=r["max_tokens"], temperature=r["temperature"],
                       top_p=r.get("top_p", 1.0), seed=r.get("seed", 0))
        choice = answers[i].choices[0]
        assert choice.message.content == alone.texts[0], i
        assert choice.finish_reason == ("length" if alone.finish_reasons[0] == "length" else "stop")
        assert answers[i].usage.completion_tokens == int(alone.lengths[0])


def test_streamed_chat_joins_to_the_whole_answer(served):
    client, model, tokenizer, _, _ = served
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "stream me"}], temperature=0.0, max_tokens=24)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len([p for p in pieces if p]) >= 2  # it arrived in pieces, not at the end
    assert "".join(pieces) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_with_n_stop_strings_and_logprobs(served):
    """n=2 sampled completions of a raw prompt cut at a stop string, with the chosen tokens' log-probabilities."""
    client, model, tokenizer, _, _ = served
    out = client.completions.create(model="tiny", prompt="The quick brown", n=2, temperature=1.0, seed=3,
                                    max_tokens=12, stop=["e"], logprobs=0)
    alone = generate(model, tokenizer, ["The quick brown"],
                     SamplingConfig(n=2, temperature=1.0, seed=3, max_new_tokens=12, stop=("e",)))
    assert [c.index for c in out.choices] == [0, 1]
    for j, choice in enumerate(out.choices):
        n_tok = int(alone.lengths[j])
        assert choice.text == alone.texts[j] and "e" not in choice.text
        assert choice.finish_reason == ("stop" if alone.finish_reasons[j] != "length" else "length")
        assert choice.logprobs.token_logprobs == pytest.approx(alone.raw_logprobs[j, :n_tok].tolist(), abs=1e-5)
    assert out.usage.completion_tokens == int(alone.lengths.sum())


def test_malformed_requests_get_openai_errors(served):
    client, _, _, _, port = served
    status, body = _post(port, "/v1/chat/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    status, body = _post(port, "/v1/chat/completions", json.dumps({"messages": "hi"}).encode())
    assert status == 400 and body["error"]["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=3.5)
    assert e.value.body["param"] == "temperature" and "[0.0, 2.0]" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], frequency_penalty=1)
    assert e.value.body["code"] == "unsupported_parameter"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "model_not_found" and "'tiny'" in e.value.body["message"]


def test_over_long_prompt_and_max_tokens_get_a_clear_400(served):
    client, _, tokenizer, _, _ = served
    long_prompt = "word " * CONTEXT
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=long_prompt, max_tokens=4)
    n = len(tokenizer.encode(long_prompt))
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"
    assert f"the prompt has {n} tokens but the model's context holds {CONTEXT}" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hello", max_tokens=CONTEXT)
    assert e.value.body["param"] == "max_tokens" and "ask for at most" in e.value.body["message"]
