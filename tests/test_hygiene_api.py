"""Key hygiene and hostile API replies, over real HTTP against servers on 127.0.0.1.

The API key never leaves its origin (redirects are refused) and is never written to a file (configs keep the
variable's name, URLs carry no userinfo); a server's malformed or hostile reply is recorded on its own
episode, never fatal to the batch or the evaluation.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from vagen.engines.api import ApiEngine
from vagen.engines.base import SamplingParams
from vagen.engines.local_server import LocalChatServer, game_responder
from vagen.eval import evaluate, rename_overrides

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-test-VAGEN-0123456789abcdef"
KEY_AS_NAME = "sk_live_51HxQ0123456789abcdefGHIJ"  # a valid variable name that is a key (Stripe style)
FAST = {"backoff_s": 0.0, "timeout_s": 5.0, "max_retries": 2}
HELLO = [[{"role": "user", "content": "hi"}]]


class Collector:
    """Another origin (its own port on 127.0.0.1): records every request it gets, answers each with a completion."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.requests.append((self.command, {k.lower(): v for k, v in self.headers.items()}))
                body = {"choices": [{"message": {"content": "<answer>Left</answer>"}, "finish_reason": "stop"}]}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_HEAD = _any

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1/chat/completions"

    def __enter__(self) -> Collector:
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def run_eval(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("evaluate", overrides=rename_overrides([f"out_dir={tmp_path}", "gif_episodes=0", *overrides]))
    return evaluate(cfg, ROOT / "configs")


def api_args(server: LocalChatServer, *more: str) -> tuple[str, ...]:
    base = ("engine=api", f"engine.base_url={server.base_url}", "engine.model=m", "engine.backoff_s=0")
    return (*base, "engine.max_retries=1", "env=[sokoban_text]", "+env_overrides.max_turns=3", "plot=false", *more)


def files_holding(folder: Path, secret: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


# ---- class 1: the key never leaves its origin, and never reaches a file -------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_origin_never_gets_the_key_nor_becomes_a_completion(monkeypatch, status):
    monkeypatch.setenv("VAGEN_TEST_API_KEY", SECRET)
    with Collector() as other, LocalChatServer(redirect_to=other.url, redirect_status=status) as home:
        engine = ApiEngine(base_url=home.base_url, model="m", api_key_env="VAGEN_TEST_API_KEY", **FAST)
        results = engine.generate_chat(HELLO * 4, SamplingParams())
    assert home.requests[0].headers["authorization"] == f"Bearer {SECRET}"  # the home server did get it
    assert [headers.get("authorization") for _, headers in other.requests] == [None] * len(other.requests)
    for result in results:
        assert not result.ok and result.text == "" and result.attempts == 1  # refused, not retried, not a reply
        assert f"HTTP {status} redirect" in result.error and "engine.base_url" in result.error
        assert "127.0.0.1" in result.error and SECRET not in result.error


def test_a_base_url_with_userinfo_is_refused_without_showing_it():
    with LocalChatServer() as server, pytest.raises(ValueError, match="user name or password") as error:
        ApiEngine(base_url=server.base_url.replace("://", f"://user:{SECRET}@"), model="m", api_key_env=None)
    assert SECRET not in str(error.value) and "api_key_env" in str(error.value)


@pytest.mark.parametrize(
    "override",
    [f"engine.api_key_env={SECRET}", f"engine.api_key_env={KEY_AS_NAME}", "engine.base_url=http://u:{key}@{host}/v1"],
    ids=["key-as-env-name", "key-shaped-name", "userinfo"],
)
def test_evaluate_refuses_a_key_in_the_config_before_writing_anything(tmp_path, monkeypatch, override):
    monkeypatch.delenv(KEY_AS_NAME, raising=False)
    with LocalChatServer(game_responder(["Left"])) as server:
        override = override.format(key=SECRET, host=server.base_url.split("/")[2])
        with pytest.raises(ValueError, match="not shown") as error:
            run_eval(tmp_path, *api_args(server, "episodes=1", override))
    assert "Fix" in str(error.value) and SECRET not in str(error.value) and KEY_AS_NAME not in str(error.value)
    assert files_holding(tmp_path, SECRET) == [] and files_holding(tmp_path, KEY_AS_NAME) == []
    assert server.requests == []


def test_config_keeps_the_variable_name_and_no_file_holds_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("VAGEN_TEST_API_KEY", SECRET)
    # A server that rejects the key and quotes it back in its error body: the recorded error must not hold it.
    with LocalChatServer(api_key="another-key") as server:
        run_eval(tmp_path, *api_args(server, "episodes=2", "engine.api_key_env=VAGEN_TEST_API_KEY"))
    assert "api_key_env: VAGEN_TEST_API_KEY" in (tmp_path / "config.yaml").read_text()
    assert files_holding(tmp_path, SECRET) == []


def test_the_script_refuses_a_key_in_one_error_line_and_writes_nothing(tmp_path):
    command = [sys.executable, str(ROOT / "scripts" / "evaluate.py"), "engine=api", "engine.model=m"]
    command += [f"engine.api_key_env={SECRET}", "env=[sokoban_text]", f"out_dir={tmp_path / 'out'}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stderr.startswith("error: engine.api_key_env")
    assert "Traceback" not in result.stderr and SECRET not in result.stderr + result.stdout
    assert not (tmp_path / "out").exists() or files_holding(tmp_path / "out", SECRET) == []


# ---- class 4: hostile replies are recorded on their own episode, never fatal --------------------------------


def _usage(value):
    def hook(answer):
        answer["usage"] = value
        return answer

    return hook


@pytest.mark.parametrize(
    "usage",
    [
        {"completion_tokens": "many"},
        {"prompt_tokens": [1], "completion_tokens": {"n": 2}},
        "lots",
        [3],
        {"completion_tokens": -4},
        {"completion_tokens": True},
        {"completion_tokens": 1.5},
    ],
)
def test_a_malformed_usage_field_costs_nothing_but_the_count(usage):
    with LocalChatServer(reply_hook=_usage(usage)) as server:
        engine = ApiEngine(base_url=server.base_url, model="m", api_key_env=None, **FAST)
        results = engine.generate_chat(HELLO * 3, SamplingParams())
    assert all(r.ok and r.text == "echo: hi [0 image(s)]" for r in results)
    assert all(r.prompt_tokens is None and r.completion_tokens is None for r in results)
    assert engine.total_prompt_tokens == engine.total_completion_tokens == 0


def test_lone_surrogates_in_a_reply_become_replacement_characters():
    with LocalChatServer(lambda messages: "\ud800<answer>Left</answer>\udfff") as server:
        engine = ApiEngine(base_url=server.base_url, model="m", api_key_env=None, **FAST)
        (result,) = engine.generate_chat(HELLO, SamplingParams())
    assert result.ok and result.text == "\ufffd<answer>Left</answer>\ufffd"
    result.text.encode("utf-8")  # writable to a file


@pytest.mark.parametrize("raw", [b"[" * 100_000, b"\xff\xfe{"], ids=["deeply-nested", "not-utf8"])
def test_a_malformed_body_is_an_error_on_its_own_request(raw):
    with LocalChatServer(reply_hook=lambda answer: raw) as server:
        engine = ApiEngine(base_url=server.base_url, model="m", api_key_env=None, **FAST)
        results = engine.generate_chat(HELLO * 2, SamplingParams())
    assert all(not r.ok and "malformed response" in r.error and r.attempts == 1 for r in results)


def test_a_reply_larger_than_the_bound_is_an_error_without_being_read_whole(monkeypatch):
    """A server that streams an endless body cannot exhaust memory: past MAX_REPLY_BYTES the reply is an error."""
    import vagen.engines.api as api

    monkeypatch.setattr(api, "MAX_REPLY_BYTES", 1000)
    with LocalChatServer(lambda messages: "x" * 5000) as server:
        engine = ApiEngine(base_url=server.base_url, model="m", api_key_env=None, **FAST)
        (result,) = engine.generate_chat(HELLO, SamplingParams())
    assert not result.ok and "larger than 1000 bytes" in result.error and result.attempts == 1


def test_a_finish_reason_that_is_not_text_is_dropped():
    def hook(answer):
        answer["choices"][0]["finish_reason"] = {"why": ["nested"]}
        return answer

    with LocalChatServer(reply_hook=hook) as server:
        engine = ApiEngine(base_url=server.base_url, model="m", api_key_env=None, **FAST)
        (result,) = engine.generate_chat(HELLO, SamplingParams())
    assert result.ok and result.finish_reason is None


def test_image_placeholder_in_a_reply_is_plain_text_of_the_assistant():
    conversation = [
        {"role": "user", "content": "Move?"},
        {"role": "assistant", "content": "<image> <answer>Left</answer>"},
        {"role": "user", "content": "Again?"},
    ]
    with LocalChatServer() as server:
        engine = ApiEngine(base_url=server.base_url, model="m", api_key_env=None, **FAST)
        (result,) = engine.generate_chat([conversation], SamplingParams())
    assert result.ok and server.requests[0].body["messages"][1]["content"] == "<image> <answer>Left</answer>"


def test_a_malformed_conversation_can_be_recorded_on_its_own_request():
    bad = [{"role": "user", "content": "look: <image>"}]  # a placeholder with no image attached
    with LocalChatServer() as server:
        engine = ApiEngine(base_url=server.base_url, model="m", api_key_env=None, **FAST)
        good, failed = engine.generate_chat([HELLO[0], bad], SamplingParams(), malformed="record")
    assert good.ok and not failed.ok and "placeholder" in failed.error and failed.attempts == 0
    assert len(server.requests) == 1


def _first_reply_is(text):
    """The first request gets `text`; every later one a valid move."""
    calls = iter(range(10**6))
    return lambda messages: text if next(calls) == 0 else "<think>go</think><answer>Left</answer>"


@pytest.mark.parametrize(
    "responder, hook",
    [
        (_first_reply_is("\ud83d oops <answer>Left</answer>"), None),
        (_first_reply_is("<image><answer>Left</answer>"), None),
        (game_responder(["Left"]), _usage({"completion_tokens": "many"})),
    ],
    ids=["surrogate", "image-placeholder", "usage"],
)
def test_the_evaluator_records_every_episode_and_a_rerun_replays_nothing(tmp_path, responder, hook):
    with LocalChatServer(responder, reply_hook=hook) as server:
        args = api_args(server, "episodes=4", "engine.api_key_env=null")
        (row,) = run_eval(tmp_path, *args).rows
        assert row["episodes"] == 4 and row["errors"] == 0
        sent = len(server.requests)
        (again,) = run_eval(tmp_path, *args).rows  # retry_failed=true: nothing failed, nothing is played again
        assert len(server.requests) == sent and (again["episodes"], again["errors"]) == (4, 0)
    for path in (tmp_path / "m" / "sokoban_text" / "episodes").glob("*.json"):
        assert json.loads(path.read_bytes().decode("utf-8"))["error"] is None
    assert hook is None or math.isnan(row["tokens_per_episode"])
