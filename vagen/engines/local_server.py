"""A tiny OpenAI-compatible chat-completions server on 127.0.0.1, for tests and offline demos.

It answers `POST /v1/chat/completions` (and `GET /v1/models`) with OpenAI-shaped JSON, the reply
text coming from a pluggable *responder* (`messages -> text`, messages as received). It records
every request so tests can assert on the payload, counts the most requests it ever had in flight,
and can be told to fail the first k requests with a status (500, 429, 400, ...), to hold each
request for a while before answering (for timeout and concurrency tests), to redirect every request
elsewhere, or to hand each answer to a hook that rewrites it (hostile-server tests).

Tokens are stood in for by whitespace-separated words: `usage` counts words (and one per image),
`max_tokens` cuts the reply to that many words with finish_reason "length", and `stop` strings cut
it before the first match, as a real server would.

    with LocalChatServer(game_responder(["Left", "Up"], seed=0)) as server:
        engine = ApiEngine.from_source(EngineSource(model_path="local"), base_url=server.base_url, api_key_env=None)

Run `python -m vagen.engines.local_server --port 8000 --actions Left Up` for a demo server that plays a game.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from PIL import Image

Responder = Callable[[list[dict[str, Any]]], str]
"""Reply text for one request's `messages` (OpenAI format, exactly as received)."""
ReplyHook = Callable[[dict[str, Any]], "dict[str, Any] | bytes"]
"""Rewrites a successful answer before it is sent: a dict is sent as JSON, bytes as they are."""

_DATA_URL_PREFIX = "data:image/"


@dataclass
class RecordedRequest:
    """One request as the server saw it: path, headers (lower-case names) and the parsed JSON body."""

    path: str
    headers: dict[str, str]
    body: Any


# ---- helpers to read OpenAI messages (also handy in tests) ----------------------------------------


def decode_data_url(url: str) -> Image.Image:
    """The image inside a `data:image/...;base64,...` URL."""
    if not url.startswith(_DATA_URL_PREFIX) or ";base64," not in url:
        raise ValueError(f"Not a base64 image data URL: {url[:40]!r}...")
    image = Image.open(io.BytesIO(base64.b64decode(url.split(";base64,", 1)[1], validate=True)))
    image.load()
    return image


def message_text(message: dict[str, Any]) -> str:
    """All text of one message, parts joined."""
    content = message.get("content") or ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def message_images(message: dict[str, Any]) -> list[Image.Image]:
    """The images of one message, decoded from their data URLs, in order."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [decode_data_url(part["image_url"]["url"]) for part in content if part.get("type") == "image_url"]


def _check_messages(body: Any) -> str | None:
    """Why `body` is not a valid chat-completions request, or None when it is."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        return "'messages' must be a non-empty list"
    for index, message in enumerate(body["messages"]):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
            return f"messages[{index}] needs a role of system, user, assistant or tool"
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if part.get("type") == "image_url":
                    try:
                        decode_data_url(part["image_url"]["url"])
                    except Exception as error:
                        return f"messages[{index}] has an unreadable image: {error}"
                elif part.get("type") != "text" or not isinstance(part.get("text"), str):
                    return f"messages[{index}] has an unknown content part {part!r}"
        elif not isinstance(content, str):
            return f"messages[{index}].content must be a string or a list of parts"
    return None


# ---- responders ------------------------------------------------------------------------------


def echo_responder(messages: list[dict[str, Any]]) -> str:
    """Repeat the last user message's text and say how many images the request carried."""
    user_messages = [m for m in messages if m.get("role") == "user"]
    last_text = message_text(user_messages[-1]) if user_messages else ""
    image_count = sum(len(message_images(m)) for m in messages)
    return f"echo: {last_text} [{image_count} image(s)]"


def game_responder(actions: Sequence[str] = ("Left",), seed: int | None = None) -> Responder:
    """A responder that plays a game: each reply is `<think>...</think><answer>ACTION</answer>`.

    With one action it always plays it; with several it picks one at random per request (seeded,
    thread-safe), which makes a usable random-policy baseline for demos.
    """
    if not actions:
        raise ValueError("game_responder needs at least one action name, e.g. ['Left', 'Up'].")
    rng, lock = random.Random(seed), threading.Lock()

    def respond(messages: list[dict[str, Any]]) -> str:
        with lock:
            action = rng.choice(list(actions))
        return f"<think>I will try {action}.</think><answer>{action}</answer>"

    return respond


def _apply_limits(text: str, max_tokens: int | None, stop: Any) -> tuple[str, str]:
    """Cut the reply at the first stop string, then to `max_tokens` words; return (text, finish_reason)."""
    for stop_string in [stop] if isinstance(stop, str) else list(stop or []):
        if stop_string and stop_string in text:
            text = text[: text.index(stop_string)]
    words = text.split()
    if max_tokens is not None and len(words) > max_tokens:
        return " ".join(words[:max_tokens]), "length"
    return text, "stop"


# ---- the server ------------------------------------------------------------------------------


class LocalChatServer:
    """A threaded OpenAI-compatible server on a free port of 127.0.0.1; a context manager.

    responder: makes the reply text (default `echo_responder`).
    fail_first: the first `fail_first` requests (counted over the server's life; `math.inf` = all) get
        `fail_status` with an OpenAI-style error body instead of an answer. Attributes may be changed live.
    delay_s: each request is held this long (while counted as in flight) before it is answered.
    api_key: when set, requests without `Authorization: Bearer <api_key>` get 401.
    redirect_to: when set, every POST is answered `redirect_status` with `Location: redirect_to`.
    reply_hook: rewrites each successful answer (see `ReplyHook`), e.g. to send a malformed `usage`.
    """

    def __init__(
        self,
        responder: Responder = echo_responder,
        *,
        fail_first: float = 0,
        fail_status: int = 500,
        delay_s: float = 0.0,
        api_key: str | None = None,
        redirect_to: str | None = None,
        redirect_status: int = 302,
        reply_hook: ReplyHook | None = None,
        model_name: str = "local",
        port: int = 0,
    ) -> None:
        self.responder = responder
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.delay_s = delay_s
        self.api_key = api_key
        self.redirect_to = redirect_to
        self.redirect_status = redirect_status
        self.reply_hook = reply_hook
        self.model_name = model_name
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._port = port
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The API root to give a client, e.g. `http://127.0.0.1:54321/v1`."""
        if self._httpd is None:
            raise RuntimeError("The server is not running; call start() or use it as a context manager.")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> LocalChatServer:
        handler = type("Handler", (_ChatHandler,), {"owner": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        self._httpd.daemon_threads = True  # a request still held by delay_s must not block stop()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes requests waiting out delay_s
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> LocalChatServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---- called by the handler threads ------------------------------------------------------
    def _record(self, request: RecordedRequest) -> int:
        """Store the request; return its 0-based index and count it as in flight."""
        with self._lock:
            self.requests.append(request)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return len(self.requests) - 1

    def _done(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _answer(self, index: int, headers: dict[str, str], body: Any) -> tuple[int, dict[str, Any] | bytes]:
        """(status, JSON or raw bytes) for one chat-completions request."""
        if self.redirect_to is not None:
            return self.redirect_status, _error_json(f"moved to {self.redirect_to}", "redirect")
        if self.delay_s > 0 and self._stopping.wait(self.delay_s):
            return 503, _error_json("server shutting down", "server_error")
        if index < self.fail_first:
            return self.fail_status, _error_json(f"injected failure {index + 1}", "server_error")
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            # Like some real servers, quote what was received: clients must not trust error bodies to be secret-free.
            received = headers.get("authorization", "")
            return 401, _error_json(f"Incorrect API key provided: {received!r}", "invalid_request_error")
        problem = _check_messages(body)
        if problem is not None:
            return 400, _error_json(problem, "invalid_request_error")
        text, finish_reason = _apply_limits(self.responder(body["messages"]), body.get("max_tokens"), body.get("stop"))
        prompt_tokens = sum(len(message_text(m).split()) + len(message_images(m)) for m in body["messages"])
        completion_tokens = len(text.split())
        answer = {
            "id": f"chatcmpl-local-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model_name),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        return 200, answer if self.reply_hook is None else self.reply_hook(answer)


def _error_json(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": None}}


class _ChatHandler(BaseHTTPRequestHandler):
    owner: LocalChatServer  # set on the per-server subclass
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read the recorded requests instead
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.owner.model_name, "object": "model"}]})
        else:
            self._send(404, _error_json(f"no route {self.path}", "not_found"))

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, _error_json(f"no route {self.path}; use /v1/chat/completions", "not_found"))
            return
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in self.headers.items()}
        index = self.owner._record(RecordedRequest(self.path, headers, body))
        try:
            status, payload = self.owner._answer(index, headers, body)
        except Exception as error:  # a broken responder is a server error, as on a real server
            status, payload = 500, _error_json(f"responder failed: {error}", "server_error")
        finally:
            self.owner._done()
        self._send(status, payload)

    def _send(self, status: int, payload: dict[str, Any] | bytes) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 429:
                self.send_header("Retry-After", "0")
            if 300 <= status < 400 and self.owner.redirect_to is not None:
                self.send_header("Location", self.owner.redirect_to)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout): nothing to tell it
            pass


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A local OpenAI-compatible server that plays a game (for demos).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--actions", nargs="+", default=["Left"], help="actions to answer with (random per request)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with LocalChatServer(game_responder(args.actions, args.seed), port=args.port) as server:
        print(f"Serving chat completions at {server.base_url} (Ctrl-C to stop)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
