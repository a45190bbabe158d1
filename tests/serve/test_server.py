"""`tempax serve` on loopback, driven by the `openai` client: requests joining the running decode and each equal to
the same request run alone, no compile after start-up, streaming, echo with prompt log-probs, /v1/models, and
OpenAI-shaped errors for malformed and over-long requests."""

from __future__ import annotations

import http.client
import json
import threading
import time

import jax
import numpy as np
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


@pytest.mark.heavy
def test_requests_join_the_running_decode_and_each_equals_its_request_alone(served):
    """A long request starts decoding; four sent while it decodes (greedy and sampled, different max_tokens and
    seeds) join it rather than wait for it, and each answer is what that request gives alone."""
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

    before = len(server.batcher.live_rows)
    first = threading.Thread(target=ask, args=(0,))
    first.start()
    while len(server.batcher.live_rows) == before:  # the long request is decoding
        threading.Event().wait(0.01)
    rest = [threading.Thread(target=ask, args=(i,)) for i in range(1, len(requests))]
    for t in rest:
        t.start()
    for t in [first, *rest]:
        t.join()
    live = list(server.batcher.live_rows)[before:]  # rows decoding after each admission
    assert live[0] == 1 and max(live[1:]) >= 2, live
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


def test_no_request_compiles_after_start_up(served):
    """Every program was compiled before the server answered: chat and completions, greedy and sampled with
    top-p / top-k / min-p, n, stop strings, streaming, echo with log-probs, prompts and completions across the
    length buckets give no backend compile (cache growth: tests/generate/test_continuous.py)."""
    client = served[0]
    compiles = []
    listener = lambda event, *args, **kwargs: compiles.append(event) if "backend_compile" in event else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for i, (words, max_tokens) in enumerate(((1, 60), (6, 20), (20, 10), (30, 4))):
            client.completions.create(model="tiny", prompt="go " * words, max_tokens=max_tokens,
                                      temperature=0.8, top_p=0.7 if i % 2 else 1.0, seed=i, n=1 + i % 2,
                                      extra_body={"top_k": 3 * i, "min_p": 0.05 * i})
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=9,
                                       temperature=0.0, stop=["a"])
        list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=5, stream=True))
        client.completions.create(model="tiny", prompt="score me", max_tokens=0, echo=True, logprobs=2)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []


def test_echo_returns_the_prompt_with_its_log_probs(served):
    """echo + logprobs as lm-eval's local-completions backend sends them: the prompt's tokens come back first,
    the first with no log-prob, each other with log p(token | tokens before), equal to a full forward pass of
    the model, and with its top alternatives; max_tokens 0 scores without generating."""
    client, model, tokenizer, _, _ = served
    ids = tokenizer.encode("The quick brown fox")
    logp = np.asarray(jax.nn.log_softmax(model(np.asarray([ids]))[0][0], axis=-1))
    expected = [logp[t - 1, ids[t]] for t in range(1, len(ids))]
    out = client.completions.create(model="tiny", prompt=ids, max_tokens=1, echo=True, logprobs=2, temperature=0)
    lp = out.choices[0].logprobs
    assert out.choices[0].text.startswith(tokenizer.decode(ids))
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:len(ids)] == pytest.approx(expected, abs=1e-4)
    for t in range(1, len(ids) + 1):
        assert len(lp.top_logprobs[t]) <= 2 and max(lp.top_logprobs[t].values()) >= lp.token_logprobs[t] - 1e-4
    greedy = tokenizer.decode([int(np.argmax(logp[-1]))], skip_special_tokens=False)
    assert lp.tokens[-1] == greedy  # the one generated (greedy) token follows
    assert lp.text_offset == [sum(len(p) for p in lp.tokens[:i]) for i in range(len(lp.tokens))]
    scored = client.completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True, logprobs=0)
    assert scored.usage.completion_tokens == 0 and scored.choices[0].logprobs.top_logprobs is None
    assert scored.choices[0].logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)


def test_a_connection_closed_under_a_request_is_one_line_not_a_traceback(capsys):
    """A request thread whose socket was closed (the client went away, or the server stopped on a signal while
    handing it over) ends with one line on stderr; socketserver would print a traceback."""
    from tempax.serve.server import OpenAIServer

    server = OpenAIServer.__new__(OpenAIServer)  # handle_error reads nothing the constructor sets
    try:
        raise OSError(9, "Bad file descriptor")
    except OSError:
        server.handle_error(None, ("127.0.0.1", 44226))
    err = capsys.readouterr().err
    assert err == ("tempax serve: a connection from 127.0.0.1 ended before its answer was sent ([Errno 9] Bad file "
                   "descriptor)\n")


@pytest.mark.heavy
def test_closing_answers_a_request_in_flight_with_a_503_and_ends_every_connection():
    """`close()` while a request decodes and a keep-alive connection idles between requests: the request gets
    OpenAI's error shape with status 503 (code server_stopping) rather than a dropped connection, the idle
    connection is ended, no connection thread is left running (one still running when the interpreter exits can
    abort the process), and the batcher refuses a request that comes after."""
    from tempax.serve.protocol import APIError, parse_completion

    others = set(threading.enumerate())  # e.g. the module's server's connections
    server = start_server(peaked_tiny_model(), tiny_chat_tokenizer(), port=0, model_name="tiny",
                          max_model_len=CONTEXT, chunk=1, max_batch=2)
    engine, decoding = server.batcher.engine, threading.Event()
    advance = engine.advance

    def slow_advance(steps):  # a token every 50 ms: the request is still decoding when the server closes
        decoding.set()
        advance(steps)
        time.sleep(0.05)

    engine.advance = slow_advance
    server.start_in_thread()
    port = server.server_address[1]
    idle = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    idle.request("GET", "/health")
    assert json.loads(idle.getresponse().read()) == {"status": "ok"}
    # Greedy: the tiny model decodes all 60 tokens of "hello" (a sampled row may hit a stop token and be answered
    # before the server closes).
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 60, "temperature": 0}
    answer: dict[str, object] = {}
    asking = threading.Thread(target=lambda: answer.update(
        zip(("status", "body"), _post(port, "/v1/completions", json.dumps(body).encode()))))
    asking.start()
    assert decoding.wait(60)
    assert server.open_connections == 2
    server.shutdown()
    server.close()
    asking.join(60)
    assert answer["status"] == 503 and answer["body"]["error"]["code"] == "server_stopping", answer
    assert server.open_connections == 0
    assert not [t for t in threading.enumerate() if t.name == "tempax-connection" and t not in others]
    with pytest.raises((http.client.HTTPException, OSError)):  # the idle connection was ended by the server
        idle.request("GET", "/health")
        idle.getresponse()
    with pytest.raises(APIError, match="the server is stopping") as refused:
        server.batcher.submit(parse_completion(body, server.tokenizer, "tiny", server.limits))
    assert refused.value.status == 503
