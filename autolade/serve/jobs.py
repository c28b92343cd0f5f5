"""Batch jobs: a file of requests decoded offline, together (``autolade batch``).

The requests go through the server's ``ModelServer`` without HTTP: up to ``max_batch`` rows share one forward
per step and a waiting line takes a row the step after one finishes (continuous batching), each answer exactly
what ``generate`` gives that request alone (greedy: ``model.generate(do_sample=False)``'s tokens).

Input, JSON Lines: each line one request body as the HTTP API takes it, a chat body (``{"messages": [...]}``) or
a completion body (``{"prompt": "..."}``), with the API's fields (``max_tokens``, ``temperature``, ``seed``,
``stop``, ``workload``, ...), or a line of OpenAI's Batch API (``{"custom_id", "method", "url", "body"}``). A
``.txt`` file: every non-empty line is one user message. Bodies need no ``model``; where they name no
``temperature`` the job's default applies (``autolade batch``: 0, exact greedy, where the API's is 1).

Output, JSON Lines, one record per input line, appended as each finishes (so in the order they finish; ``line``
says which): ``{"line", "custom_id", "input_sha", "response": {"text", "finish_reason", "usage", "autolade"}}``,
or ``{"line", "custom_id", "input_sha", "error": {"message", "type", "param", "code"}}`` for a request the API
would refuse (the rest go on). A job that stops (Ctrl-C, a kill) resumes when run again with the same output:
the lines whose record is there (matched by line number and the input line's digest) are skipped, a record cut
off mid-write is dropped, a line that met a fault of the machine (``"type": "server_error"``) runs again. An output written for another input is refused, never appended to.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autolade.errors import AutoladeError
from autolade.serve.requests import DEFAULT_MAX_TOKENS, ApiError, decode_request, requested_tokens
from autolade.serve.turns import Cancelled

CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"


class JobError(AutoladeError):
    """A job that cannot start: an unreadable input, an output that belongs to another input."""


@dataclass(frozen=True)
class JobLine:
    """One request of the input."""

    line: int  # 1-based line number in the input file
    digest: str  # of the line's text: ties an output record to the line it answers
    custom_id: str | None = None  # the Batch API's id, echoed in the record
    body: dict[str, Any] = field(default_factory=dict)
    chat: bool = True  # /v1/chat/completions (messages) or /v1/completions (prompt)
    error: ApiError | None = None  # the line could not be read as a request


@dataclass
class JobSummary:
    lines: int  # requests in the input
    skipped: int  # already answered in the output (a resumed job)
    answered: int = 0
    errors: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    interrupted: bool = False


def job_tokens(lines: list[JobLine]) -> int:
    """The most new tokens the job's readable lines ask for (``requests.requested_tokens``, else the API's default)."""
    def asked(body: dict[str, Any]) -> int:
        try:
            return requested_tokens(body) or DEFAULT_MAX_TOKENS
        except ApiError:  # refused when it runs; counted as the default meanwhile
            return DEFAULT_MAX_TOKENS

    return sum(asked(line.body) for line in lines if line.error is None)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def read_job(path: Path, *, temperature: float = 0.0, max_tokens: int | None = None) -> list[JobLine]:
    """The requests of ``path`` (JSON Lines, or a ``.txt`` of one user message per line); blank lines skipped.
    ``temperature`` / ``max_tokens``: what a body that names none gets."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise JobError(f"cannot read the input {path}: {exc}") from None
    plain = path.suffix.lower() == ".txt"
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        line = JobLine(line=number, digest=digest(raw))
        line = replace(line, body={"messages": [{"role": "user", "content": raw}]}) if plain else _json_line(line, raw)
        if line.error is None:
            line.body.setdefault("temperature", temperature)
            if max_tokens is not None and "max_tokens" not in line.body and "max_completion_tokens" not in line.body:
                line.body["max_tokens"] = max_tokens
        lines.append(line)
    if not lines:
        raise JobError(f"{path} holds no requests: one JSON object per line ({{\"messages\": [...]}} or {{\"prompt\": ...}}), "
                       "or a .txt file of one prompt per line")
    return lines


def _json_line(line: JobLine, raw: str) -> JobLine:
    """``line`` (its number and digest) with the request ``raw`` holds, or the error that it holds none."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return replace(line, error=ApiError(400, f"line {line.line} is not valid JSON: {exc}"))
    if not isinstance(obj, dict):
        return replace(line, error=ApiError(400, f"line {line.line} must be a JSON object"))
    line = replace(line, custom_id=None if obj.get("custom_id") is None else str(obj["custom_id"]))
    if "body" in obj:  # OpenAI's Batch API: the endpoint in "url", the request in "body"
        url, body = obj.get("url", CHAT_URL), obj.get("body")
        if url not in (CHAT_URL, COMPLETIONS_URL) or not isinstance(body, dict):
            return replace(line, error=ApiError(400, f"line {line.line}: 'url' must be {CHAT_URL} or {COMPLETIONS_URL} "
                                                     "and 'body' an object", param="url"))
        return replace(line, body=dict(body), chat=url == CHAT_URL)
    body = {k: v for k, v in obj.items() if k != "custom_id"}
    return replace(line, body=body, chat="prompt" not in body)


def answered(out: Path, lines: list[JobLine]) -> set[int]:
    """Line numbers the output already answers; a record cut off by a kill (the last line, unfinished) is removed.
    Raises ``JobError`` where the output answers another input."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    if data and not data.endswith(b"\n"):  # the last record was being written when the job stopped
        data = data[: data.rfind(b"\n") + 1]
        out.write_bytes(data)
    by_line = {line.line: line for line in lines}
    done = set()
    for k, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        try:
            record = json.loads(raw)
            number, sha = int(record["line"]), str(record["input_sha"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise JobError(f"{out} line {k} is not a record of autolade batch: give another --output "
                           "(or --overwrite to start it again)") from None
        line = by_line.get(number)
        if line is not None and line.digest == sha:
            if record.get("error", {}).get("type") != "server_error":  # a refused request stays refused; a fault is retried
                done.add(number)
        elif "error" not in record:  # an answer to a line that is not in this input: another job's output
            raise JobError(f"{out} answers another input (its record of line {number} does not match this input's "
                           "line): give another --output, or --overwrite to start it again")
    return done


class BatchJob:
    """Runs the lines of one input through a ``ModelServer``, writing each record as it finishes."""

    def __init__(self, server: Any, lines: list[JobLine], out: Path, *, workers: int) -> None:
        self.server = server
        self.lines = lines
        self.out = out
        self.workers = max(1, workers)
        self.stop = threading.Event()  # set: rows in flight are dropped at the next step, no new line starts
        self._lock = threading.Lock()

    def run(self, *, resume: bool = True, progress: Callable[[JobSummary], None] | None = None) -> JobSummary:
        done = answered(self.out, self.lines) if resume else set()
        if not resume:
            self.out.write_bytes(b"")
        todo = [line for line in self.lines if line.line not in done]
        summary = JobSummary(lines=len(self.lines), skipped=len(self.lines) - len(todo))
        t0 = time.perf_counter()
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="autolade-job")
        try:
            futures = [pool.submit(self._one, line, summary, progress) for line in todo]
            pending = set(futures)
            while pending:  # short waits, so that Ctrl-C reaches this thread
                _, pending = wait(pending, timeout=0.5)
        except KeyboardInterrupt:
            self.stop.set()
            summary.interrupted = True
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            summary.seconds = time.perf_counter() - t0
        return summary

    def _one(self, line: JobLine, summary: JobSummary, progress: Callable[[JobSummary], None] | None) -> None:
        if self.stop.is_set():
            return
        record: dict[str, Any] = {"line": line.line, "custom_id": line.custom_id, "input_sha": line.digest}
        try:
            if line.error is not None:
                raise line.error
            req = decode_request({"model": self.server.name, **line.body}, chat=line.chat, served=self.server.name)
            if req.stream:
                raise ApiError(400, "'stream' has no meaning in a batch job: leave it out", param="stream")
            done = self.server.run(req, cancelled=self.stop.is_set)
        except Cancelled:
            return
        except ApiError as exc:
            record["error"] = exc.body()["error"]
        except Exception as exc:  # a fault in the forward (every row in flight gets it): the line is redone on resume
            record["error"] = {"message": f"{type(exc).__name__}: {exc}", "type": "server_error", "param": None, "code": None}
        else:
            record["response"] = {
                "text": done.text, "finish_reason": done.finish_reason,
                "usage": {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
                          "total_tokens": done.prompt_tokens + done.completion_tokens},
                "autolade": done.settings,
            }  # fmt: skip
        with self._lock:
            with self.out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            if "error" in record:
                summary.errors += 1
            else:
                summary.answered += 1
                summary.completion_tokens += record["response"]["usage"]["completion_tokens"]
            if progress is not None:
                progress(summary)
