"""Where a prompt broke from its cache: an agent's 30k-token prefix prefilled again because one byte
changed early in it (a clock in the system prompt, a tool list reordered), and nobody can see why.

When a prompt arrives, the engine holds the nearest cached prefix (in memory: mlx_lm's prompt trie;
on disk: the files' token ids). A **break** is a prompt that shares the start of a cached sequence
but differs from it before that sequence ends: the token index where they part, the message (its
index and role) that token falls in, and a short excerpt of both texts around it (escaped, capped).
A prompt that only goes past what is cached (the next turn of a conversation) is no break.

What a request's prefix cache came to (``Outcome``) rides on its generation context, so the
handler puts it in the ``X-Localchat-Prefix-Cache`` header, the engine's log line, ``ps`` and
``/metrics``. Never the whole prompt, and nothing written to a file but the engine's own log.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

HEADER = "X-Localchat-Prefix-Cache"
EXCERPT_TOKENS = 12
MIN_SHARED = 4  # a prompt that shares less (a begin-of-text token, a role marker) is another conversation
EXCERPT_CHARS = 48
KEPT_OUTCOMES = 256  # prompts fetched but not yet answered (each is taken when its request starts)


@dataclass(frozen=True)
class Break:
    """The first token where a prompt differs from a cached sequence that goes on past it."""

    at: int  # the token index
    cached_after: tuple[int, ...]  # the cached sequence's tokens from ``at`` (a few)
    new_after: tuple[int, ...]  # the prompt's
    before: tuple[int, ...]  # the shared tokens just before ``at``
    message: int | None = None  # the message the token falls in (located by the handler)
    role: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What a prompt's prefix cache came to: the tokens served from it, their tier, and its break."""

    cached: int
    tier: str  # "memory", "disk", or "" when nothing was cached
    broke: Break | None = None

    def header(self) -> str:
        parts = [f"cached={self.cached}"] + ([f"tier={self.tier}"] if self.tier else [])
        if self.broke is not None:
            parts.append(f"broke-at={self.broke.at}")
            if self.broke.message is not None:
                parts += [f"message={self.broke.message}", f"role={self.broke.role}"]
        return "; ".join(parts)


def trie_break(trie: Any, model: Any, tokens: list[int]) -> Break | None:
    """The break against mlx_lm's prompt trie (its ``search``: how far the prompt walks, and the
    nearest cached sequence past that point)."""
    found = trie.search(model, tokens)
    return parted(tokens, found.longer, found.common_prefix)


def parted(tokens: list[int], cached: Any, shared: int) -> Break | None:
    if cached is None or shared < MIN_SHARED or shared >= len(tokens) or len(cached) <= shared:
        return None  # the prompt goes past all that is cached: no break
    return Break(at=shared, cached_after=tuple(cached[shared:shared + EXCERPT_TOKENS]),
                 new_after=tuple(tokens[shared:shared + EXCERPT_TOKENS]),
                 before=tuple(tokens[max(0, shared - EXCERPT_TOKENS):shared]))


def later(a: Break | None, b: Break | None) -> Break | None:
    """The break further into the prompt (the prefix the prompt came closest to keeping)."""
    if a is None or b is None:
        return a or b
    return a if a.at >= b.at else b


class Outcomes:
    """Each fetched prompt's outcome, by its tokens, until its request takes it (bounded)."""

    def __init__(self) -> None:
        self._by_prompt: dict[int, Outcome] = {}
        self._lock = threading.Lock()

    def put(self, tokens: list[int], outcome: Outcome) -> None:
        with self._lock:
            if len(self._by_prompt) >= KEPT_OUTCOMES:
                self._by_prompt.pop(next(iter(self._by_prompt)))
            self._by_prompt[hash(tuple(tokens))] = outcome

    def take(self, tokens: list[int]) -> Outcome | None:
        with self._lock:
            return self._by_prompt.pop(hash(tuple(tokens)), None)


def located(broke: Break, tokenizer: Any, messages: Any, tools: Any) -> Break:
    """``broke`` with the message its token falls in: the fewest leading messages whose template
    holds more tokens than the break's index (found by halving: a few template calls)."""
    if not isinstance(messages, list) or not messages:
        return broke

    def length(count: int) -> int:
        return len(tokenizer.apply_chat_template(messages[:count], tools=tools, tokenize=True,
                                                 add_generation_prompt=False))

    low, high = 1, len(messages)
    try:
        if length(high) <= broke.at:
            return replace(broke, message=len(messages), role="(the generation prompt)")
        while low < high:
            mid = (low + high) // 2
            if length(mid) > broke.at:
                high = mid
            else:
                low = mid + 1
    except Exception:  # noqa: BLE001 - a template that takes no partial conversation: the index alone
        return broke
    role = messages[low - 1].get("role") if isinstance(messages[low - 1], dict) else None
    return replace(broke, message=low - 1, role=str(role)[:20] if role else "?")


def excerpt(tokenizer: Any, tokens: tuple[int, ...], tail: bool = False) -> str:
    """A few tokens as text, escaped (``json``'s escapes: no control character reaches a log) and capped."""
    text = json.dumps(tokenizer.decode(list(tokens)), ensure_ascii=True)[1:-1]
    return ("…" + text[-EXCERPT_CHARS:]) if tail and len(text) > EXCERPT_CHARS else text[:EXCERPT_CHARS]


def log_line(outcome: Outcome, tokenizer: Any, prompt_tokens: int) -> str:
    broke = outcome.broke
    assert broke is not None
    where = f"message {broke.message} ({broke.role})" if broke.message is not None else "an unknown message"
    shared = excerpt(tokenizer, broke.before, tail=True)
    return (f"localchat: prompt cache: broke at token {broke.at:,} of {prompt_tokens:,}, in {where}: after "
            f"\"{shared}\" the cache has \"{excerpt(tokenizer, broke.cached_after)}\", the prompt "
            f"\"{excerpt(tokenizer, broke.new_after)}\"; {prompt_tokens - outcome.cached:,} tokens prefilled")


@dataclass
class LastBreak:
    """The engine's latest break, for ``ps``."""

    at: int = 0
    message: int | None = None
    role: str | None = None
    when: float = 0.0

    def noted(self, broke: Break) -> None:
        self.at, self.message, self.role, self.when = broke.at, broke.message, broke.role, time.time()

    def shown(self) -> dict[str, Any] | None:
        return None if not self.when else {"at": self.at, "message": self.message, "role": self.role,
                                           "when": self.when}
