"""Stop sequences, matched on the answer as it streams.

The gateway matches them itself rather than sending ``stop`` upstream: mlx_lm.server ends on a stop
word with the same ``finish_reason`` as on the end of the turn and drops the word, so a client could
not be told which sequence stopped the reply (Anthropic's ``stop_sequence``). The tail that could be
the start of a sequence is held back until the next chunk says what it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from localchat.backends.http import unfinished_tail


@dataclass
class StopWatch:
    sequences: tuple[str, ...]
    matched: str | None = None
    _pending: str = field(default="", repr=False)

    def feed(self, text: str) -> str:
        """The text that may be shown now; after a match, nothing more (``matched`` says which)."""
        if not self.sequences or self.matched is not None:
            return "" if self.matched is not None else text
        text = self._pending + text
        hits = [(text.find(s), s) for s in self.sequences if s in text]
        if hits:
            at, self.matched = min(hits)
            self._pending = ""
            return text[:at]
        held = unfinished_tail(text, self.sequences)
        self._pending = text[len(text) - held:] if held else ""
        return text[:len(text) - held]

    def flush(self) -> str:
        """What was held back, once the reply has ended without a match."""
        rest, self._pending = self._pending, ""
        return "" if self.matched is not None else rest
