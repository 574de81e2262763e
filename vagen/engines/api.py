"""The OpenAI-compatible API engine: chat messages in, text out, for benchmarking served or hosted models.

Why this engine speaks messages, not token ids
----------------------------------------------
Every other engine is token-in/token-out (see `base`): training needs the exact sampled ids and
their log-probs. A chat-completions server takes chat messages, applies ITS OWN chat template and
tokenizer, and returns text. Decoding our context ids back to text and sending that would look like
it fits the interface but would be wrong twice: the server re-tokenises (so the ids we would
return are not the ones sampled), and it returns no log-probs we could train on. So the line is
drawn in the type: the main method is `generate_chat(conversations, sampling)`, returning
`ApiGeneration`s (text, finish reason, token usage, error); `generate(contexts, ...)` and
`update_weights` raise, saying to call `generate_chat` or to use the "hf" / "vllm" engine for
training. The engine exists for evaluation and benchmarking, where text is all that is needed.

Messages
--------
A conversation is a list of message dicts. Each has a `role` and a `content` that is either

* a string, with one `IMAGE_PLACEHOLDER` ("<image>") per entry of an optional `images` list of PIL
  images, exactly the shape of an `Observation` (`{"role": "user", "content": obs.text,
  "images": obs.images}`); an assistant's string is what the model wrote, sent as is (an "<image>"
  in a reply is text, never a slot for an image); or
* a list of parts: `{"type": "text", "text": ...}`, `{"type": "image", "image": <PIL image>}`
  (the transformers chat-template style; a bare `{"type": "image"}` takes the next entry of the
  message's `images` list), or an already-encoded `{"type": "image_url", ...}` part, sent as is.

Images go out as base64 PNG data URLs in OpenAI's content-part format. Messages are validated and
encoded BEFORE any request is sent, so a malformed conversation raises `ValueError` at once (or, with
`malformed="record"`, becomes an error of its own, the others being sent).

Transport
---------
Plain `urllib` from the standard library (no extra dependency; the `openai` client brings its own
retry policy, which would nest inside ours). Each request gets `timeout_s` per blocking socket
operation (connect, each read), the same semantics as httpx/openai. Failures are retried with
exponential backoff (`backoff_s * 2**k`, jittered, capped at `MAX_BACKOFF_S`, at least the
server's `Retry-After`) on 408, 429, 5xx, timeouts and connection errors; other 4xx (400 bad
request, 401 bad key, 404 wrong model) are the caller's fault and are not retried. At most
`max_concurrency` requests of this engine are in flight at once, across all threads calling it.
A request that finally fails becomes an `ApiGeneration` with `error` set: one bad request never
costs the rest of the batch. A reply is read defensively: lone UTF-16 surrogates (invalid Unicode a
JSON escape can carry) become U+FFFD, a `usage` count that is not a count is unknown (None), a body
that is not a completion is an error of that request.

The API key is read from the environment variable named `api_key_env` when the engine is built.
It is kept in a wrapper whose repr is hidden and is scrubbed from every error message. It goes to
`base_url`'s server only: redirects are refused, not followed (urllib would resend the header to
whichever host a 30x names), and a `base_url` with userinfo (`user:pass@host`) is refused.
"""

from __future__ import annotations

import base64
import io
import ipaddress
import json
import logging
import os
import random
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from vagen.engines.base import Context, EngineSource, Generation, SamplingParams
from vagen.env.observation import IMAGE_PLACEHOLDER

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
"""No single wait between retries is longer than this, whatever the backoff or `Retry-After` say."""
MAX_REPLY_BYTES = 16 << 20  # a chat completion is kilobytes; a larger body is refused rather than read into memory
RETRYABLE_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
_ERROR_BODY_CHARS = 300  # enough of a server's error body to diagnose, short enough for a log line
_HIDDEN = "<hidden>"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]*@")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins escaped pairs: what is left is alone

Message = Mapping[str, Any]


@dataclass
class ApiGeneration:
    """What the API engine returns for one conversation.

    text: the reply ("" when the request failed).
    finish_reason: as the server reports it ("stop", "length", "content_filter", ...); None on failure.
    prompt_tokens / completion_tokens: the server's `usage` counts, None when it sent none.
    error: None on success; otherwise why the request finally failed (status, server message, attempts).
    attempts: how many HTTP requests were made for this conversation (1 + retries).
    latency_s: wall time from the first attempt to the final answer, backoff waits included.
    """

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    attempts: int = 0
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class _Secret:
    """Holds the API key so that no repr, str or traceback of the engine ever shows it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return _HIDDEN

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("The API key is not picklable; build the engine again where it is needed.")


@dataclass
class _Failure:
    """One failed attempt: the message for the caller, whether trying again may help, the server's wish."""

    message: str
    retryable: bool
    retry_after_s: float | None = None


# ---- message encoding ------------------------------------------------------------------------


def image_to_data_url(image: Image.Image) -> str:
    """Encode a PIL image as a `data:image/png;base64,...` URL (lossless, so pixels survive exactly)."""
    if image.mode not in ("RGB", "RGBA", "L", "LA"):
        has_alpha = "A" in image.mode or "transparency" in image.info
        image = image.convert("RGBA" if has_alpha else "RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _image_part(image: Any, where: str) -> dict[str, Any]:
    if not isinstance(image, Image.Image):
        raise ValueError(f"{where}: expected a PIL image, got {type(image).__name__}; pass PIL.Image.Image objects.")
    return {"type": "image_url", "image_url": {"url": image_to_data_url(image)}}


def _parts_from_placeholders(text: str, images: list[Any], where: str) -> list[dict[str, Any]]:
    pieces = text.split(IMAGE_PLACEHOLDER)
    if len(pieces) - 1 != len(images):
        raise ValueError(
            f"{where}: the content has {len(pieces) - 1} {IMAGE_PLACEHOLDER!r} placeholder(s) but "
            f"{len(images)} image(s) are attached; put exactly one placeholder per image in the text."
        )
    parts: list[dict[str, Any]] = []
    for index, piece in enumerate(pieces):
        if index:
            parts.append(_image_part(images[index - 1], f"{where}, image {index - 1}"))
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _parts_from_list(content: list[Any], images: list[Any], where: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    pending_images = iter(images)
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        here = f"{where}, part {index}"
        if kind == "text":
            parts.append({"type": "text", "text": str(part["text"])})
        elif kind == "image":
            image = part.get("image", next(pending_images, None))
            if image is None:
                raise ValueError(f"{here}: an image part without an image and no unused entry in `images` is left.")
            parts.append(_image_part(image, here))
        elif kind == "image_url":
            parts.append(dict(part))
        else:
            raise ValueError(f"{here}: unknown content part {part!r}; use type 'text', 'image' or 'image_url'.")
    if next(pending_images, None) is not None:
        raise ValueError(f"{where}: more entries in `images` than bare {{'type': 'image'}} parts; remove the extras.")
    return parts


def to_openai_message(message: Message, where: str = "message") -> dict[str, Any]:
    """Turn one message (see the module docstring) into OpenAI's chat format; raise `ValueError` if malformed."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise ValueError(f"{where}: expected a dict with a string 'role' and a 'content', got {message!r}.")
    content, images = message.get("content", ""), list(message.get("images", []))
    if isinstance(content, str) and message["role"] == "assistant":
        if images:
            raise ValueError(f"{where}: an assistant message carries no images; attach them to a user message.")
        return {"role": "assistant", "content": content}
    if isinstance(content, str):
        if not images and IMAGE_PLACEHOLDER not in content:
            # Plain strings are the most widely accepted content (some servers refuse parts for "system").
            return {"role": message["role"], "content": content}
        parts = _parts_from_placeholders(content, images, where)
    elif isinstance(content, list):
        parts = _parts_from_list(content, images, where)
    else:
        raise ValueError(f"{where}: 'content' must be a string or a list of parts, got {type(content).__name__}.")
    return {"role": message["role"], "content": parts}


def sampling_to_request_fields(sampling: SamplingParams, stop: list[str] | None = None) -> dict[str, Any]:
    """The request fields that carry `sampling`.

    `stop_token_ids` are NOT sent: they name ids of OUR tokenizer, and the server already ends a
    turn at its chat template's end-of-turn token; pass literal `stop` strings instead. `top_k` is
    sent only when set (vLLM, SGLang and llama.cpp servers accept it; OpenAI itself answers 400).
    Under greedy decoding top_p / top_k / seed mean nothing (see `SamplingParams`), so they are left out.
    """
    fields: dict[str, Any] = {"max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature}
    if not sampling.greedy:
        fields["top_p"] = sampling.top_p
        if sampling.top_k > 0:
            fields["top_k"] = sampling.top_k
        if sampling.seed is not None:
            fields["seed"] = sampling.seed
    if stop:
        fields["stop"] = list(stop)
    return fields


# ---- the engine --------------------------------------------------------------------------------


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ApiEngine:
    """Chat completions from an OpenAI-compatible server (OpenAI, vLLM serve, SGLang, llama.cpp, ...).

    Build it with `ApiEngine.from_source(EngineSource(model_path="served-name"), base_url="http://host:8000/v1")`
    and call `generate_chat`. `base_url` is the API root including `/v1`, as for the openai client.
    It is not in `ENGINES`: a server returns text, not the token ids and log-probs a rollout engine must
    (token-in/token-out), so it evaluates models and never trains them.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_concurrency: int = 8,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        _check_settings(base_url, model, timeout_s, max_retries, backoff_s, max_concurrency)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        self.max_concurrency = max_concurrency
        self.extra_body = dict(extra_body or {})
        self._api_key = _Secret(_read_api_key(api_key_env))
        self._slots = threading.BoundedSemaphore(max_concurrency)
        # A proxy set in the environment must not capture requests to a server on this machine.
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(self.base_url) else []
        self._opener = urllib.request.build_opener(_RefuseRedirects(), *handlers)
        self._usage_lock = threading.Lock()
        self.total_prompt_tokens = 0
        self.total_completion_tokens = 0

    @classmethod
    def from_source(
        cls, source: EngineSource, *, base_url: str | None = None, model: str | None = None, **engine_kwargs: Any
    ) -> ApiEngine:
        """`model` (the served model's name) defaults to `source.model_path`; other kwargs go to `__init__`."""
        if base_url is None:
            raise ValueError("The api engine needs base_url, e.g. base_url='http://127.0.0.1:8000/v1'.")
        model = model if model is not None else source.model_path
        if not model:
            raise ValueError(
                "The api engine needs the served model's name: set EngineSource.model_path or pass model='...'."
            )
        return cls(base_url=base_url, model=model, **engine_kwargs)

    def __repr__(self) -> str:
        return (
            f"ApiEngine(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r}, "
            f"timeout_s={self.timeout_s}, max_retries={self.max_retries}, max_concurrency={self.max_concurrency})"
        )

    # ---- the token-id interface is not what a chat server speaks --------------------------------
    def generate(self, contexts: list[Context], sampling: SamplingParams) -> list[Generation]:
        raise NotImplementedError(
            "The api engine takes chat messages, not token ids: a chat-completions server applies its own "
            "template and tokenizer and returns no log-probs to train on. Call engine.generate_chat(conversations, "
            "sampling) for evaluation, or use the 'hf' or 'vllm' engine for training."
        )

    def forget(self) -> None:
        """Nothing to drop: a server keeps no state of ours between calls."""

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        raise NotImplementedError(
            "The api engine cannot change a served model's weights; reload them on the server, "
            "or use the 'hf' or 'vllm' engine for training."
        )

    # ---- chat ---------------------------------------------------------------------------------
    def build_payload(
        self, conversation: list[Message], sampling: SamplingParams, stop: list[str] | None = None
    ) -> dict[str, Any]:
        """The JSON body for one conversation; raises `ValueError` on a malformed message."""
        if not conversation:
            raise ValueError("A conversation must hold at least one message.")
        messages = [to_openai_message(m, f"message {i}") for i, m in enumerate(conversation)]
        return {
            **self.extra_body,
            "model": self.model,
            "messages": messages,
            **sampling_to_request_fields(sampling, stop),
        }

    def generate_chat(
        self,
        conversations: list[list[Message]],
        sampling: SamplingParams,
        stop: list[str] | None = None,
        *,
        malformed: str = "raise",
    ) -> list[ApiGeneration]:
        """One `ApiGeneration` per conversation, in order; requests run concurrently up to `max_concurrency`.

        Malformed messages raise `ValueError` before anything is sent (`malformed="record"`: that conversation
        gets an `ApiGeneration(error=...)` with 0 attempts, the others are sent); network and server failures
        never raise, they come back as `ApiGeneration(error=...)`.
        """
        if malformed not in ("raise", "record"):
            raise ValueError(f"malformed must be 'raise' or 'record', got {malformed!r}.")
        outcomes: list[dict[str, Any] | ApiGeneration] = []
        for conversation in conversations:
            try:
                outcomes.append(self.build_payload(conversation, sampling, stop))
            except ValueError as error:
                if malformed == "raise":
                    raise
                outcomes.append(ApiGeneration(error=_valid_text(f"malformed conversation, not sent: {error}")))
        payloads = [outcome for outcome in outcomes if isinstance(outcome, dict)]
        if not payloads:
            return [outcome for outcome in outcomes if isinstance(outcome, ApiGeneration)]
        with ThreadPoolExecutor(max_workers=min(len(payloads), self.max_concurrency)) as pool:
            completed = iter(list(pool.map(self._complete, payloads)))
        return [outcome if isinstance(outcome, ApiGeneration) else next(completed) for outcome in outcomes]

    def _complete(self, payload: dict[str, Any]) -> ApiGeneration:
        """Send one payload with retries; never raises."""
        body = json.dumps(payload).encode("utf-8")
        started = time.monotonic()
        failure = _Failure("no attempt was made", retryable=False)
        for attempt in range(1, self.max_retries + 2):
            with self._slots:
                outcome = self._attempt(body)
            if isinstance(outcome, ApiGeneration):
                outcome.attempts, outcome.latency_s = attempt, time.monotonic() - started
                self._add_usage(outcome)
                return outcome
            failure = outcome
            if not failure.retryable or attempt > self.max_retries:
                break
            wait = self._backoff(attempt, failure.retry_after_s)
            logger.debug("api request failed (%s); retry %d in %.2fs", self._redact(failure.message), attempt, wait)
            time.sleep(wait)
        return ApiGeneration(
            error=_valid_text(self._redact(f"{failure.message} (after {attempt} attempt(s) to {self.base_url})")),
            attempts=attempt,
            latency_s=time.monotonic() - started,
        )

    def _attempt(self, body: bytes) -> ApiGeneration | _Failure:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key.reveal():
            headers["Authorization"] = f"Bearer {self._api_key.reveal()}"
        request = urllib.request.Request(self.base_url + "/chat/completions", data=body, headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                raw = response.read(MAX_REPLY_BYTES + 1)
        except urllib.error.HTTPError as error:
            return _http_failure(error)
        except OSError as error:  # URLError wraps connect failures; a read timeout arrives bare
            reason = getattr(error, "reason", error)
            if isinstance(reason, TimeoutError) or isinstance(error, TimeoutError):
                return _Failure(f"timed out after {self.timeout_s}s", retryable=True)
            return _Failure(f"connection error: {reason}", retryable=True)
        except Exception as error:  # http.client protocol errors (IncompleteRead, BadStatusLine, ...)
            return _Failure(f"transport error: {type(error).__name__}: {error}", retryable=True)
        if len(raw) > MAX_REPLY_BYTES:
            return _Failure(f"the reply is larger than {MAX_REPLY_BYTES} bytes (no chat completion)", retryable=False)
        return _parse_completion(raw)

    def _backoff(self, attempt: int, retry_after_s: float | None) -> float:
        # Jitter spreads the retries of a batch that failed together, so they don't hit the server in lockstep.
        wait = self.backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.0)
        return min(max(wait, retry_after_s or 0.0), MAX_BACKOFF_S)

    def _add_usage(self, generation: ApiGeneration) -> None:
        with self._usage_lock:
            self.total_prompt_tokens += generation.prompt_tokens or 0
            self.total_completion_tokens += generation.completion_tokens or 0

    def _redact(self, text: str) -> str:
        return _hide(text, self._api_key.reveal())


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Answers a redirect with its HTTPError instead of following it: urllib would resend the Authorization
    header to whichever host the 30x names (and turn the POST into a GET without its body)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # urllib's signature
        raise urllib.error.HTTPError(req.full_url, code, msg, headers, fp)


# ---- helpers ---------------------------------------------------------------------------------


def _check_settings(
    base_url: str, model: str, timeout_s: float, max_retries: int, backoff_s: float, max_concurrency: int
) -> None:
    check_base_url(base_url)
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be the served model's name, got {model!r}.")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}.")
    if not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}; use 0 to never retry.")
    if not backoff_s >= 0:
        raise ValueError(f"backoff_s must be >= 0 seconds, got {backoff_s!r}.")
    if not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ValueError(f"max_concurrency must be an int >= 1, got {max_concurrency!r}.")


def check_base_url(base_url: Any) -> None:
    """Raise `ValueError` unless `base_url` is an http(s) URL without userinfo (never echoed: it may hold a key)."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        shown = str(base_url).rpartition("@")[2]  # whatever precedes an "@" may be a key
        raise ValueError(f"base_url must start with http:// or https://, got {shown!r}.")
    if "@" in urllib.parse.urlsplit(base_url).netloc:
        raise ValueError(
            "engine.base_url carries a user name or password (scheme://user:...@host); it is not shown here and never "
            "sent, in case it is the key. Fix: give base_url without it (e.g. https://host/v1), export the key as "
            "OPENAI_API_KEY and pass engine.api_key_env=OPENAI_API_KEY."
        )


def _looks_like_key(name: str) -> bool:
    # Variable names are short words (OPENAI_API_KEY); keys are long and mix in lower-case letters and digits.
    mixed = any(c.islower() for c in name) and any(c.isdigit() for c in name)
    return (len(name) >= 20 and mixed) or len(name) >= 40


def check_api_key_env(api_key_env: Any) -> None:
    """Raise `ValueError` unless `api_key_env` is None or the NAME of an environment variable; a value that is not
    a name, or an unset name that looks like a key, is refused without being echoed: it is most likely the key."""
    if api_key_env is None:
        return
    is_name = isinstance(api_key_env, str) and _ENV_NAME.fullmatch(api_key_env)
    if not is_name or (api_key_env not in os.environ and _looks_like_key(api_key_env)):
        reason = "not a variable name" if not is_name else "no variable that is set, and looks like a key itself"
        raise ValueError(
            "engine.api_key_env must be the NAME of an environment variable that holds the key (e.g. OPENAI_API_KEY), "
            f"and the value given is {reason}; it is not shown here in case it is the key. Fix: "
            "export OPENAI_API_KEY=... and pass engine.api_key_env=OPENAI_API_KEY."
        )


def redact_secrets(text: str, api_key_env: str | None) -> str:
    """`text` fit for a file: URLs without userinfo, and the key held in `api_key_env` (if it is set) hidden."""
    text = _USERINFO.sub(r"\1", text)
    return _hide(text, os.environ.get(api_key_env, "") if api_key_env else "")


def _hide(text: str, key: str) -> str:
    """`text` with `key` hidden, also in another case or JSON-escaped (as a server may echo it back)."""
    if not key:
        return text
    variants = {key, json.dumps(key)[1:-1]}
    pattern = "|".join(re.escape(variant) for variant in sorted(variants, key=len, reverse=True))
    return re.sub(pattern, _HIDDEN, text, flags=re.IGNORECASE)


def _valid_text(text: str) -> str:
    """`text` with lone UTF-16 surrogates replaced by U+FFFD: they are not Unicode and cannot be written as UTF-8."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def _read_api_key(api_key_env: str | None) -> str:
    """The key from the environment ("" when none is named or set: servers on localhost rarely need one)."""
    check_api_key_env(api_key_env)
    if api_key_env is None:
        return ""
    key = os.environ.get(api_key_env, "")
    if not key:
        logger.warning("Environment variable %s is not set; requests go without an Authorization header.", api_key_env)
    elif not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        # Checked here because http.client's own error for a bad header value would quote the key.
        raise ValueError(
            f"The API key in {api_key_env} contains whitespace or non-printable characters; fix the variable."
        )
    return key


def _server_error_message(body: str) -> str:
    """The `error.message` of OpenAI's error JSON, or the raw body when it is something else."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return body
    if isinstance(error, Mapping):
        return str(error.get("message", body))
    return str(error) if error else body


def _redirect_failure(error: urllib.error.HTTPError) -> _Failure:
    target = urllib.parse.urlsplit(urllib.parse.urljoin(error.url, error.headers.get("Location", "")))
    origin = f"{target.scheme}://{target.hostname}" + (f":{target.port}" if target.port else "")
    error.close()
    return _Failure(
        f"HTTP {error.code} redirect to {origin} refused: the API key goes to engine.base_url's own server only, "
        "and a redirected request loses its body. Fix: if you trust that server, set engine.base_url to its address.",
        retryable=False,
    )


def _http_failure(error: urllib.error.HTTPError) -> _Failure:
    if 300 <= error.code < 400:
        return _redirect_failure(error)
    try:
        body = error.read(4096).decode("utf-8", "replace")
    except OSError:
        body = ""
    finally:
        error.close()
    try:
        retry_after: float | None = float(error.headers.get("Retry-After", ""))
    except (TypeError, ValueError, AttributeError):  # absent, or an HTTP date: fall back to our own backoff
        retry_after = None
    message = _server_error_message(body)[:_ERROR_BODY_CHARS]
    text = f"HTTP {error.code}: {message}" if message else f"HTTP {error.code}"
    return _Failure(text, retryable=error.code in RETRYABLE_STATUS, retry_after_s=retry_after)


def _count(value: Any) -> int | None:
    """A `usage` token count, or None (unknown) when the server sent something that is not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _parse_completion(raw: bytes) -> ApiGeneration | _Failure:
    """Read an OpenAI chat-completion body; a malformed one is a (non-retried) failure."""
    try:
        data = json.loads(raw)
        choice = data["choices"][0]
        content = choice["message"].get("content") or ""
        if isinstance(content, list):  # some servers answer in parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        usage = data.get("usage") if isinstance(data.get("usage"), Mapping) else {}
        finish_reason = choice.get("finish_reason")
        return ApiGeneration(
            text=_valid_text(str(content)),
            finish_reason=_valid_text(finish_reason) if isinstance(finish_reason, str) else None,
            prompt_tokens=_count(usage.get("prompt_tokens")),
            completion_tokens=_count(usage.get("completion_tokens")),
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as error:
        snippet = raw[:_ERROR_BODY_CHARS].decode("utf-8", "replace")
        return _Failure(f"malformed response ({type(error).__name__}: {error}): {snippet!r}", retryable=False)
