"""The model side of the server: one loaded model and tokenizer, requests decoded in turns.

Knows nothing of HTTP: ``ModelServer.run`` takes a checked ``DecodeRequest``, decodes it with
``autolade.generate`` (settings resolved per workload as generate() always does, the n-gram memory and
the token recycling table shared by every request of a workload) and hands text deltas to
``on_text`` as steps complete. ``cancelled()`` is polled after every step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autolade.api import generate
from autolade.config import LookaheadConfig
from autolade.errors import AutoladeError
from autolade.serve.requests import DEFAULT_MAX_TOKENS, ApiError, DecodeRequest
from autolade.serve.turns import Cancelled, FairTurn, TextDeltas


@dataclass(frozen=True)
class Completion:
    """One finished request."""

    text: str
    finish_reason: str  # "stop" (eos or a stop string) or "length" (max_tokens)
    prompt_tokens: int
    completion_tokens: int
    settings: dict[str, Any]  # what ran: W/N/G, where they came from, tokens/step (the response's "autolade" field)


class ModelServer:
    """One model behind the API. Thread-safe: every request takes turns at the model (``FairTurn``)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, name: str, workload: str | None = None,
                 memory: bool | None = None, config: LookaheadConfig | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name  # what clients pass as "model"
        self.workload = workload  # a request's default workload (None: chat for chat requests, code for raw prompts)
        self.memory = memory  # generate(memory=): None = its default (on for greedy)
        self.config = config  # every request's settings; None: resolved per workload (profile, prediction, default)
        self.turn = FairTurn()
        self.context = int(getattr(getattr(model.config, "get_text_config", lambda: model.config)(),
                                   "max_position_embeddings", 0) or 0)
        self.started = threading.Event()  # set once the first request decoded (warm)

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

    def run(self, req: DecodeRequest, *, on_text: Callable[[str], None] | None = None,
            cancelled: Callable[[], bool] = lambda: False) -> Completion:
        ids = self.encode(req)
        max_new = self.budget(req, ids.shape[1])
        deltas = TextDeltas(self.tokenizer, stop=req.stop)
        ticket = self.turn.acquire()

        def on_tokens(tokens: list[int]) -> None:  # after every decode step: stream, then hand the model on
            nonlocal ticket
            delta = deltas.add(tokens)
            if delta and on_text is not None:
                on_text(delta)
            if cancelled():
                raise Cancelled
            ticket = self.turn.pass_on(ticket)

        sampled = req.temperature > 0
        try:
            res = generate(
                self.model, ids, max_new_tokens=max_new, tokenizer=self.tokenizer, on_tokens=on_tokens,
                workload=req.workload or self.workload or ("chat" if req.chat else "code"),
                do_sample=sampled, temperature=req.temperature if sampled else None,
                top_p=req.top_p if sampled else None, seed=req.seed if sampled else None,
                stop_strings=list(req.stop) or None, memory=self.memory, config=self.config,
            )
        except AutoladeError as exc:
            raise ApiError(400, str(exc)) from None
        finally:
            self.turn.release(ticket)
        self.started.set()
        rest = deltas.finish()
        if rest and on_text is not None:
            on_text(rest)
        stats = res.stats
        stopped = stats.stop_reason != "max_new_tokens" or deltas.stopped
        return Completion(
            text=deltas.text(), finish_reason="stop" if stopped else "length", prompt_tokens=int(ids.shape[1]),
            completion_tokens=stats.new_tokens,
            settings={"window": stats.settings["window"], "ngram": stats.settings["ngram"],
                      "guesses": stats.settings["guesses"], "prompt_lookup": stats.settings["prompt_lookup"],
                      "source": stats.settings_source, "policy": stats.policy, "memory": stats.memory,
                      "tokens_per_step": round(stats.tokens_per_step, 3), "sampled": sampled},
        )
