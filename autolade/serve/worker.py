"""The model side of the server: one loaded model and tokenizer, requests decoded together.

Knows nothing of HTTP: ``ModelServer.run`` takes a checked ``DecodeRequest``, resolves its settings as
``generate()`` does (per workload: profile, prediction or default; the n-gram memory and the token
recycling table of that workload), and submits it to the ``BatchLoop``, where it joins the rows in
flight at the next step boundary: all requests go through one forward per step. Text deltas reach
``on_text`` as steps complete; ``cancelled()`` is polled before every step. The answer is remembered
in the request's own thread once its row is done, so no store write happens inside the decode loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from autolade.api import MEMORY_DEFAULT
from autolade.compiling import check_compile, default_runners
from autolade.config import LookaheadConfig
from autolade.engine.batch import RowRequest
from autolade.engine.sampling import make_verifier
from autolade.errors import AutoladeError
from autolade.machine.models import eos_ids
from autolade.machine.threads import release_thread_pool
from autolade.prepare import RunSetup, setup_run, stats_of, stop_fn
from autolade.runtime.settings import stored_compile, stored_cost
from autolade.serve.batching import BatchLoop
from autolade.serve.requests import DEFAULT_MAX_TOKENS, ApiError, DecodeRequest
from autolade.serve.turns import TextDeltas


@dataclass(frozen=True)
class Completion:
    """One finished request."""

    text: str
    finish_reason: str  # "stop" (eos or a stop string) or "length" (max_tokens)
    prompt_tokens: int
    completion_tokens: int
    settings: dict[str, Any]  # what ran: W/N/G, where they came from, tokens/step (the response's "autolade" field)


class ModelServer:
    """One model behind the API. Thread-safe: requests decode together in one ``BatchLoop``."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, name: str, workload: str | None = None,
                 memory: bool | None = None, config: LookaheadConfig | None = None, max_batch: int = 8,
                 compile: bool | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name  # what clients pass as "model"
        self.workload = workload  # a request's default workload (None: chat for chat requests, code for raw prompts)
        self.memory = memory  # generate(memory=): None = its default (on for greedy)
        self.config = config  # every request's settings; None: resolved per workload (profile, prediction, default)
        # steps run compiled (one graph for every batch, ``engine.batch_compiled``) where ``compile`` says; None:
        # where this machine's stored curves say the compiled step pays (``autolade profile --compile``)
        self.compiled = check_compile(compile) if compile is not None else stored_compile(self.model)
        runner = default_runners().batch(self.model) if self.compiled else None
        self.loop = BatchLoop(self.model, max_rows=max_batch, step_cost=stored_cost(self.model, compiled=self.compiled),
                              runner=runner)  # at most max_batch rows per forward; the rest wait
        self.eos = eos_ids(self.model)
        self.context = int(getattr(getattr(model.config, "get_text_config", lambda: model.config)(),
                                   "max_position_embeddings", 0) or 0)
        self.started = threading.Event()  # set once the first request decoded (warm)
        release_thread_pool()  # this thread's OpenMP workers would slow the loop's (machine/threads.py)

    def warm_up(self) -> float:
        """Decode two short rows through the loop, so that a compiled step's graph is built before the first
        request (tens of seconds on a CPU); returns the seconds it took."""
        t0 = time.perf_counter()
        vocab = self.loop.decoder.runner.vocab
        config = LookaheadConfig(window=0, guesses=0, prompt_lookup=4)
        jobs = [self.loop.submit(RowRequest(prompt=[(7 * i + b) % vocab for i in range(12 + 4 * b)], config=config,
                                            max_new_tokens=4)) for b in range(2)]
        for job in jobs:
            job.wait()
        return time.perf_counter() - t0

    def encode(self, req: DecodeRequest) -> torch.Tensor:
        """Token ids [1, T]: chat messages through the model's own chat template, a raw prompt as it is."""
        tok = self.tokenizer
        if req.chat:
            messages = [{"role": role, "content": content} for role, content in req.messages]
            if not getattr(tok, "chat_template", None):
                raise ApiError(400, f"{self.name} has no chat template: use /v1/completions with a prompt")
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
        else:
            ids = tok(req.prompt, return_tensors="pt").input_ids
        if ids.numel() == 0:
            raise ApiError(400, "the prompt encodes to no tokens", param="messages" if req.chat else "prompt")
        return ids.to(torch.long)

    def budget(self, req: DecodeRequest, prompt_tokens: int) -> int:
        """max_tokens, checked against the context (a default is capped to the room left)."""
        room = self.context - prompt_tokens if self.context else None
        if room is not None and room < 1:
            raise ApiError(400, f"the prompt is {prompt_tokens} tokens; {self.name}'s context is {self.context}",
                           param="messages" if req.chat else "prompt", code="context_length_exceeded")
        if req.max_tokens is None:
            return min(DEFAULT_MAX_TOKENS, room) if room is not None else DEFAULT_MAX_TOKENS
        if room is not None and req.max_tokens > room:
            raise ApiError(400, f"max_tokens {req.max_tokens} + the prompt's {prompt_tokens} tokens exceed {self.name}'s "
                           f"context of {self.context}: ask for at most {room}", param="max_tokens",
                           code="context_length_exceeded")
        return req.max_tokens

    def prepare(self, req: DecodeRequest, ids: torch.Tensor, max_new: int,
                on_tokens: Callable[[list[int]], None]) -> tuple[RowRequest, RunSetup]:
        """The engine request for ``req``, with its settings resolved as generate() resolves them."""
        sampled = req.temperature > 0
        run = setup_run(self.model, window=None, ngram=None, guesses=None, config=self.config, policy=None,
                        workload=req.workload or self.workload or ("chat" if req.chat else "code"), sampled=sampled,
                        memory=self.memory, pad_single=False, memory_default=MEMORY_DEFAULT, tokenizer=self.tokenizer,
                        compile=self.compiled)  # drafts priced on the curve of the steps that run
        verifier = make_verifier(self.model, do_sample=sampled, temperature=req.temperature if sampled else None,
                                 top_p=req.top_p if sampled else None, seed=req.seed if sampled else None)
        request = RowRequest(prompt=ids[0].tolist(), config=run.config, max_new_tokens=max_new, eos_ids=self.eos,
                             stop=stop_fn(None, list(req.stop) or None, self.tokenizer), policy=run.policy,
                             verifier=verifier, on_tokens=on_tokens, memory=run.answers, token_cost=run.token_cost,
                             recycled=run.recycled)  # fmt: skip
        release_thread_pool()  # if settling the settings ran a parallel op here, its pool would slow the loop's
        return request, run

    def run(self, req: DecodeRequest, *, on_text: Callable[[str], None] | None = None,
            cancelled: Callable[[], bool] = lambda: False) -> Completion:
        ids = self.encode(req)
        max_new = self.budget(req, ids.shape[1])
        deltas = TextDeltas(self.tokenizer, stop=req.stop)

        def on_tokens(tokens: list[int]) -> None:  # in the loop's thread, after every step of this row
            delta = deltas.add(tokens)
            if delta and on_text is not None:
                on_text(delta)

        try:
            request, run = self.prepare(req, ids, max_new, on_tokens)
            t0 = time.perf_counter()
            row = self.loop.submit(request, cancelled=cancelled).wait()
        except AutoladeError as exc:
            raise ApiError(400, str(exc)) from None
        wall = time.perf_counter() - t0
        memory_note = run.memory_note
        if run.remember is not None:  # here, in the request's thread: the decode loop never waits on the store
            memory_note += "" if (why := run.remember(row.out)) is None else f"; {why}"
        self.started.set()
        rest = deltas.finish()
        if rest and on_text is not None:
            on_text(rest)
        stats = replace(stats_of(row.log, len(row.out), wall, run.config, run.source, run.policy), memory=memory_note)
        stopped = stats.stop_reason != "max_new_tokens" or deltas.stopped
        return Completion(
            text=deltas.text(), finish_reason="stop" if stopped else "length", prompt_tokens=int(ids.shape[1]),
            completion_tokens=stats.new_tokens,
            settings={"window": stats.settings["window"], "ngram": stats.settings["ngram"],
                      "guesses": stats.settings["guesses"], "prompt_lookup": stats.settings["prompt_lookup"],
                      "source": stats.settings_source, "policy": stats.policy, "memory": stats.memory,
                      "tokens_per_step": round(stats.tokens_per_step, 3), "sampled": req.temperature > 0},
        )
