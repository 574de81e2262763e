"""The OpenAI-compatible API engine, over real HTTP against `LocalChatServer` on 127.0.0.1."""

from __future__ import annotations

import math
import socket
import threading

import numpy as np
import pytest
from PIL import Image

from vagen.engines.api import ApiEngine, ApiGeneration
from vagen.engines.base import ENGINES, Context, Engine, EngineSource, SamplingParams
from vagen.engines.local_server import LocalChatServer, decode_data_url, game_responder, message_images
from vagen.env.parsing import parse_response

SECRET = "sk-test-VAGEN-0123456789abcdef"
FAST = {"backoff_s": 0.01, "timeout_s": 5.0, "api_key_env": None}


def make_engine(server: LocalChatServer, **overrides) -> ApiEngine:
    kwargs = {**FAST, **overrides}
    return ApiEngine.from_source(EngineSource(model_path="test-model"), base_url=server.base_url, **kwargs)


def checker_image() -> Image.Image:
    pixels = np.zeros((6, 5, 3), dtype=np.uint8)
    pixels[::2, ::2] = (255, 0, 0)
    pixels[1::2, 1::2] = (12, 200, 77)
    return Image.fromarray(pixels)


@pytest.fixture
def server():
    with LocalChatServer() as running:
        yield running


def test_registered_and_builds_from_source(server):
    engine = make_engine(server)
    assert "api" not in ENGINES and isinstance(engine, ApiEngine) and isinstance(engine, Engine)
    assert engine.model == "test-model" and engine.base_url == server.base_url
    with pytest.raises(ValueError, match="model_path"):
        ApiEngine.from_source(EngineSource(), base_url=server.base_url)
    with pytest.raises(ValueError, match="base_url"):
        ApiEngine.from_source(EngineSource(model_path="m"))
    with pytest.raises(ValueError, match="max_concurrency"):
        ApiEngine.from_source(EngineSource(model_path="m"), base_url=server.base_url, max_concurrency=0)


def test_token_interface_raises_pointing_to_generate_chat(server):
    engine = make_engine(server)
    with pytest.raises(NotImplementedError, match="generate_chat"):
        engine.generate([Context(token_ids=[1, 2, 3])], SamplingParams())
    with pytest.raises(NotImplementedError, match="weights"):
        engine.update_weights({})
    assert server.requests == []


def test_text_round_trip_keeps_order_and_reports_usage(server):
    engine = make_engine(server)
    conversations = [
        [{"role": "system", "content": "You play a game."}, {"role": "user", "content": f"state {i}"}] for i in range(5)
    ]
    results = engine.generate_chat(conversations, SamplingParams(max_new_tokens=32, temperature=0.7, seed=3))
    assert [r.text for r in results] == [f"echo: state {i} [0 image(s)]" for i in range(5)]
    assert all(r.ok and r.finish_reason == "stop" and r.attempts == 1 for r in results)
    assert all(r.prompt_tokens == 6 and r.completion_tokens == 5 for r in results)
    assert engine.total_prompt_tokens == 30 and engine.total_completion_tokens == 25
    body = server.requests[0].body
    assert body["model"] == "test-model"
    assert body["messages"][0] == {"role": "system", "content": "You play a game."}
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (32, 0.7, 1.0, 3)


def test_image_conversation_payload_decodes_to_the_same_pixels(server):
    engine = make_engine(server)
    image, other = checker_image(), Image.new("RGB", (3, 2), (9, 8, 7))
    observation_style = [{"role": "user", "content": "Look: <image> and <image>. Move?", "images": [image, other]}]
    parts_style = [{"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image", "image": image}]}]
    results = engine.generate_chat([observation_style, parts_style], SamplingParams(temperature=0))
    assert [r.text for r in results] == ["echo: Look:  and . Move? [2 image(s)]", "echo: Look: [1 image(s)]"]
    by_text = {r.body["messages"][0]["content"][0]["text"]: r.body for r in server.requests}
    parts = by_text["Look: "]["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "text", "image_url", "text"]
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    decoded = [decode_data_url(p["image_url"]["url"]) for p in parts if p["type"] == "image_url"]
    assert np.array_equal(np.asarray(decoded[0]), np.asarray(image))
    assert np.array_equal(np.asarray(decoded[1]), np.asarray(other))
    assert np.array_equal(np.asarray(message_images(by_text["Look:"]["messages"][0])[0]), np.asarray(image))


def test_greedy_omits_sampling_knobs_and_limits_are_mapped(server):
    engine = make_engine(server)
    conversation = [{"role": "user", "content": "one two three four five six"}]
    greedy = SamplingParams(max_new_tokens=3, temperature=0, top_p=0.5, seed=7)
    (cut,) = engine.generate_chat([conversation], greedy)
    assert (cut.text, cut.finish_reason, cut.completion_tokens) == ("echo: one two", "length", 3)
    body = server.requests[-1].body
    assert body["temperature"] == 0 and body["max_tokens"] == 3
    assert "top_p" not in body and "seed" not in body and "stop" not in body
    (stopped,) = engine.generate_chat([conversation], SamplingParams(top_k=5), stop=["four"])
    assert stopped.text == "echo: one two three " and stopped.finish_reason == "stop"
    assert server.requests[-1].body["stop"] == ["four"] and server.requests[-1].body["top_k"] == 5


def test_malformed_message_raises_before_any_request(server):
    engine = make_engine(server)
    with pytest.raises(ValueError, match="placeholder"):
        engine.generate_chat(
            [[{"role": "user", "content": "no placeholder", "images": [checker_image()]}]], SamplingParams()
        )
    with pytest.raises(ValueError, match="unknown content part"):
        engine.generate_chat([[{"role": "user", "content": [{"type": "audio"}]}]], SamplingParams())
    assert server.requests == []


@pytest.mark.parametrize("status", [500, 429, 503])
def test_retries_after_two_failures_then_succeeds(server, status):
    server.fail_first, server.fail_status = 2, status
    (result,) = make_engine(server, max_retries=3).generate_chat(
        [[{"role": "user", "content": "hi"}]], SamplingParams()
    )
    assert result.ok and result.text == "echo: hi [0 image(s)]" and result.attempts == 3
    assert len(server.requests) == 3


def test_permanent_failure_returns_one_error_per_request_without_raising(server):
    server.fail_first = math.inf
    engine = make_engine(server, max_retries=2, max_concurrency=4)
    results = engine.generate_chat([[{"role": "user", "content": f"q{i}"}] for i in range(4)], SamplingParams())
    assert len(results) == 4 and all(isinstance(r, ApiGeneration) and not r.ok for r in results)
    assert all("HTTP 500" in r.error and "injected failure" in r.error and r.attempts == 3 for r in results)
    assert all(r.text == "" and r.finish_reason is None for r in results)
    assert len(server.requests) == 4 * 3  # bounded: 1 try + max_retries per conversation


def test_client_errors_are_not_retried(server):
    server.fail_first, server.fail_status = math.inf, 400
    (result,) = make_engine(server, max_retries=3).generate_chat([[{"role": "user", "content": "x"}]], SamplingParams())
    assert not result.ok and result.error.startswith("HTTP 400") and result.attempts == 1
    assert len(server.requests) == 1


def test_unreachable_server_is_a_connection_error():
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = ApiEngine(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1, **FAST)
    (result,) = engine.generate_chat([[{"role": "user", "content": "x"}]], SamplingParams())
    assert not result.ok and "connection error" in result.error and result.attempts == 2


def test_timeout_is_honoured():
    # The server would answer successfully after 30 s; a "timed out" error proves the client gave up first.
    with LocalChatServer(delay_s=30.0) as slow:
        engine = make_engine(slow, timeout_s=0.2, max_retries=1)
        (result,) = engine.generate_chat([[{"role": "user", "content": "x"}]], SamplingParams())
        assert not result.ok and "timed out after 0.2s" in result.error and result.attempts == 2
        assert len(slow.requests) == 2


def test_concurrency_limit_holds_across_calls_and_threads():
    with LocalChatServer(delay_s=0.15) as slow:
        engine = make_engine(slow, max_concurrency=3)
        batch = [[{"role": "user", "content": f"q{i}"}] for i in range(5)]
        outputs: list[list[ApiGeneration]] = []
        callers = [threading.Thread(target=lambda: outputs.append(engine.generate_chat(batch, SamplingParams())))]
        callers.append(threading.Thread(target=lambda: outputs.append(engine.generate_chat(batch, SamplingParams()))))
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        assert len(slow.requests) == 10 and all(r.ok for out in outputs for r in out)
        assert 2 <= slow.max_in_flight <= 3  # concurrent, and never above the limit


def test_api_key_goes_in_the_header_and_nowhere_else(monkeypatch):
    monkeypatch.setenv("VAGEN_TEST_API_KEY", SECRET)
    with LocalChatServer(api_key=SECRET) as guarded:
        engine = make_engine(guarded, api_key_env="VAGEN_TEST_API_KEY")
        (result,) = engine.generate_chat([[{"role": "user", "content": "x"}]], SamplingParams())
        assert result.ok
        assert guarded.requests[0].headers["authorization"] == f"Bearer {SECRET}"
        assert SECRET not in repr(engine) and SECRET not in str(engine) and SECRET not in repr(vars(engine))
    # A server that rejects the key and quotes it back in its error body (as some do).
    with LocalChatServer(api_key="a-different-key") as rejecting:
        engine = make_engine(rejecting, api_key_env="VAGEN_TEST_API_KEY", max_retries=3)
        (result,) = engine.generate_chat([[{"role": "user", "content": "x"}]], SamplingParams())
        assert rejecting.requests[0].headers["authorization"] == f"Bearer {SECRET}"  # it really was sent
        assert result.error.startswith("HTTP 401") and "Incorrect API key" in result.error
        assert SECRET not in result.error and result.attempts == 1


def test_redaction_hides_the_key_in_any_case_and_json_escaped(monkeypatch):
    import json

    key = 'sk-AbC"dEf\\9'
    monkeypatch.setenv("VAGEN_TEST_API_KEY", key)
    with LocalChatServer() as server:
        engine = make_engine(server, api_key_env="VAGEN_TEST_API_KEY")
    redacted = engine._redact(f"upper {key.upper()} json {json.dumps(key)} lower {key.lower()} plain {key}")
    for form in (key, key.upper(), key.lower(), json.dumps(key)[1:-1]):
        assert form not in redacted, form


def test_a_key_given_as_the_variable_name_is_refused_without_showing_it():
    with LocalChatServer() as server, pytest.raises(ValueError, match="NAME of an environment variable") as error:
        make_engine(server, api_key_env=SECRET)
    assert SECRET not in str(error.value)


def test_game_responder_answers_in_the_parsers_format():
    with LocalChatServer(game_responder(["Left", "Up"], seed=0)) as game:
        engine = make_engine(game)
        results = engine.generate_chat([[{"role": "user", "content": "Where to?"}]] * 6, SamplingParams())
    parsed = [parse_response(r.text) for r in results]
    assert all(p.format_ok for p in parsed)
    assert {a for p in parsed for a in p.actions} <= {"Left", "Up"}
