"""Taking turns at one model: requests decode in their own threads and hand the model on after every
decode step, first come first served, so no request waits behind a long one for more than one step of
each other request in flight.

The engine's ``on_tokens`` callback runs after every step; the server passes one that calls
``FairTurn.pass_on()`` there. Each request keeps its own KV cache inside its decode call, so steps of
different requests can interleave on one model without changing any request's tokens.
"""

from __future__ import annotations

import threading
from collections import deque


class Cancelled(Exception):
    """The client went away: the decode stops at the next step boundary and frees its turn."""


class FairTurn:
    """A first-in first-out lock: ``acquire`` queues, ``pass_on`` goes to the back of the queue."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()  # waiting tickets; the head holds the turn
        self.served = 0  # turns handed out, for tests and stats

    def acquire(self) -> object:
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            self._cond.wait_for(lambda: self._queue[0] is ticket)
            self.served += 1
        return ticket

    def release(self, ticket: object) -> None:
        with self._cond:
            if not self._queue or self._queue[0] is not ticket:
                raise RuntimeError("release of a turn not held")
            self._queue.popleft()
            self._cond.notify_all()

    def pass_on(self, ticket: object) -> object:
        """Give the turn to the next waiter (if any) and queue again; returns the new ticket."""
        with self._cond:
            if len(self._queue) == 1:  # nobody waits: keep the turn
                return ticket
        self.release(ticket)
        return self.acquire()

    @property
    def waiting(self) -> int:
        with self._cond:
            return max(len(self._queue) - 1, 0)


class TextDeltas:
    """Decoded text as tokens arrive, as deltas: holds back an incomplete UTF-8 tail and, with stop
    strings, the last characters that could still begin one (the reply ends before a stop string)."""

    def __init__(self, tokenizer, *, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.tokens: list[int] = []
        self.sent = 0  # characters of the text already handed out
        self.stopped = False  # a stop string was seen: nothing more is handed out

    def text(self) -> str:
        """The reply so far, cut before the first stop string."""
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return text[:cut]
        return text

    def add(self, tokens: list[int]) -> str:
        """The new text these tokens make available (maybe "")."""
        self.tokens.extend(tokens)
        if self.stopped:
            return ""
        text = self.text()
        safe = len(text)
        if text.endswith("\ufffd"):
            return ""
        if not self.stopped and self.stop:
            safe -= max(len(s) for s in self.stop) - 1  # a stop string may start in this tail
        if safe <= self.sent:
            return ""
        delta, self.sent = text[self.sent : safe], safe
        return delta

    def finish(self) -> str:
        """The rest of the text at the end of the decode."""
        text = self.text()
        delta, self.sent = text[self.sent :], len(text)
        return delta
