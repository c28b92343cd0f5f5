"""OpenAI request bodies in, one validated ``DecodeRequest`` out; OpenAI-style errors for the rest.

The server reads the JSON itself (no schema library): each field is checked here, and a bad one is
an ``ApiError`` whose message names the field and what it accepts. What it cannot honour (``n > 1``,
``logprobs``, tools, penalties) is refused, never ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

MAX_STOP = 4  # stop strings per request, as OpenAI allows
DEFAULT_MAX_TOKENS = 256  # when a request names none (capped to the room the context leaves)
MAX_WAITING = 64  # requests that may wait for a free row beyond those decoding (--max-waiting); more get a 503
UNSUPPORTED = {  # field -> why it is refused when set to anything but its neutral value
    "logprobs": "log-probabilities are not returned",
    "top_logprobs": "log-probabilities are not returned",
    "tools": "tool calls are not supported",
    "tool_choice": "tool calls are not supported",
    "functions": "function calls are not supported",
    "function_call": "function calls are not supported",
    "presence_penalty": "presence_penalty would change the distribution; only 0 is supported",
    "frequency_penalty": "frequency_penalty would change the distribution; only 0 is supported",
    "logit_bias": "logit_bias is not supported",
    "best_of": "best_of is not supported",
    "echo": "echo is not supported",
    "suffix": "suffix is not supported",
}
NEUTRAL = (None, False, 0, [], {}, "none")  # values that ask for nothing (0 == 0.0 == False)


class ApiError(Exception):
    """An OpenAI-style error: HTTP ``status`` and the ``{"error": {...}}`` body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True, kw_only=True)
class DecodeRequest:
    """One request, checked: what the decode runs."""

    chat: bool  # /v1/chat/completions (messages through the chat template) or /v1/completions (raw prompt)
    messages: tuple[tuple[str, str], ...] = ()  # (role, content) for chat
    prompt: str = ""  # for completions
    max_tokens: int | None = None  # None: DEFAULT_MAX_TOKENS, capped to the context's room
    temperature: float = 1.0  # OpenAI's default; 0 = exact greedy (the lookahead speedup applies)
    top_p: float = 1.0  # nucleus sampling; 1 = off
    seed: int | None = None  # a sampled answer's seed (None: drawn)
    stop: tuple[str, ...] = ()  # the reply ends before the first of these
    stream: bool = False  # server-sent events, as the openai client expects
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the token counts
    workload: str | None = None  # picks the tuned profile (chat, code, ...); None: the server's default


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def decode_request(body: dict[str, Any], *, chat: bool, served: str) -> DecodeRequest:
    """The checked request; ``served``: the model name this server answers to."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, f"'model' is required: this server serves {served!r}", param="model")
    if model != served:
        raise ApiError(404, f"the model {model!r} does not exist here; this server serves {served!r} (GET /v1/models)",
                       param="model", code="model_not_found")
    for field, why in UNSUPPORTED.items():
        if field in body and body[field] not in NEUTRAL and not (field == "best_of" and body[field] == 1):
            raise ApiError(400, f"'{field}': {why}", param=field, code="unsupported_parameter")
    if body.get("n", 1) != 1:
        raise ApiError(400, "'n' must be 1: one choice per request (send several requests instead)", param="n",
                       code="unsupported_parameter")
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise ApiError(400, "'response_format': only {\"type\": \"text\"} is supported", param="response_format",
                       code="unsupported_parameter")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    return DecodeRequest(
        chat=chat,
        messages=_messages(body.get("messages")) if chat else (),
        prompt="" if chat else _prompt(body.get("prompt")),
        max_tokens=requested_tokens(body),
        temperature=_number(body, "temperature", 1.0, low=0.0, high=2.0),
        top_p=_number(body, "top_p", 1.0, low=0.0, high=1.0, open_low=True),
        seed=_seed(body.get("seed")),
        stop=_stop(body.get("stop")),
        stream=_flag(body, "stream"),
        include_usage=bool(stream_options.get("include_usage", False)),
        workload=_workload(body.get("workload")),
    )


def _messages(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'messages' must be a non-empty list of {\"role\", \"content\"} objects", param="messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
            raise ApiError(400, f"messages[{i}] needs a role of system, developer, user or assistant", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported", param="messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string", param="messages")
        out.append(("system" if m["role"] == "developer" else m["role"], content))
    return tuple(out)


def _prompt(raw: Any) -> str:
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]
    if not isinstance(raw, str) or not raw:
        raise ApiError(400, "'prompt' must be a non-empty string (one prompt per request)", param="prompt")
    return raw


def requested_tokens(body: dict[str, Any]) -> int | None:
    """The new tokens a request body asks for (``max_completion_tokens``, else ``max_tokens``); None: it names none;
    an ``ApiError`` for a value that is not an integer >= 1."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(400, f"'{name}' must be an integer >= 1, got {value!r}", param=name)
    return value


def _number(body: dict[str, Any], name: str, default: float, *, low: float, high: float, open_low: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a number, got {value!r}", param=name)
    if value > high or value < low or (open_low and value == low):
        bound = f"({low}, {high}]" if open_low else f"[{low}, {high}]"
        raise ApiError(400, f"'{name}' must be in {bound}, got {value!r}", param=name)
    return float(value)


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'seed' must be an integer, got {value!r}", param="seed")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
        raise ApiError(400, f"'stop' must be a non-empty string or a list of up to {MAX_STOP} of them", param="stop")
    return tuple(stops)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {value!r}", param=name)
    return value


def _workload(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ApiError(400, "'workload' must be a workload name such as chat or code", param="workload")
    return value.strip()
