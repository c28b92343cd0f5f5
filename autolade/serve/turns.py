"""What a request thread needs around the batch loop: ``Cancelled`` (the client went away) and
``TextDeltas`` (decoded text handed out as deltas while tokens arrive)."""

from __future__ import annotations


class Cancelled(Exception):
    """The client went away: its row leaves the batch at the next step boundary."""


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
