"""What a request's mask is made of in the engine: the grammar setup read once per tokenizer, each
request's mask kept by its generation arguments, and the mask as the engine calls it (a reply the
grammar can take no further ends there). ``enforcing`` puts them into mlx_lm.server."""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from localchat.serve.engine.requested import Enforcement


class ByIdentity:
    """What was made for an object (a request's generation arguments: its mask; a request: its
    budget), kept by the object's identity while it lives: an entry goes when its object does."""

    def __init__(self) -> None:
        self._kept: dict[int, Any] = {}
        self._lock = threading.Lock()

    def put(self, owner: Any, value: Any) -> None:
        if value is None:
            return
        with self._lock:
            self._kept[id(owner)] = value
        weakref.finalize(owner, self._forget, id(owner))

    def of(self, owner: Any) -> Any:
        with self._lock:
            return self._kept.get(id(owner))

    def _forget(self, key: int) -> None:
        with self._lock:
            self._kept.pop(key, None)


class TokenizerGrammars:
    """The loaded tokenizer's grammar setup and template traits, read once (llguidance's view of a
    49k vocabulary takes about a second: the first formatted request waits for it), again when the
    server loads another model."""

    def __init__(self) -> None:
        self._for: tuple[Any, Any, Any] | None = None  # (tokenizer, setup, traits)

    def of(self, tokenizer: Any, model: Any) -> tuple[Any, Any]:
        from localchat.backends.masking import GrammarSetup
        from localchat.templates.render import ChatTemplate

        if self._for is None or self._for[0] is not tokenizer:
            setup = GrammarSetup(tokenizer, getattr(getattr(model, "args", None), "vocab_size", None))
            self._for = (tokenizer, setup, ChatTemplate(tokenizer, "served model").traits)
        return self._for[1], self._for[2]


class EndOnDeadEnd:
    """The mask as the engine calls it: a reply the grammar can take no further ends here (its end
    token only), said in the server's log, instead of an exception in the engine's thread."""

    def __init__(self, masked: Any, eos: tuple[int, ...]) -> None:
        self.masked, self.eos, self.ended = masked, eos, False

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        from localchat.grammar.mask import DeadEnd

        if not self.ended:
            try:
                return self.masked(tokens, logits)
            except DeadEnd as exc:
                logging.warning("localchat: a reply ended early: %s", exc)
                self.ended = True
        keep = mx.zeros(logits.shape[-1], dtype=mx.bool_)
        keep[list(self.eos)] = True
        return mx.where(keep, logits, mx.array(-float("inf"), dtype=logits.dtype))


def mask_for(enforcement: Enforcement, tokenizer: Any, model: Any, prompt: list[int], masks: TokenizerGrammars):
    """The reply's processor and the sampler wrapper it needs, or None when nothing is enforced."""
    setup, traits = masks.of(tokenizer, model)
    banned = enforcement.banned_marker(traits, tokenizer)
    masked = setup.for_reply(enforcement.answer(), enforcement.tools, traits, prompt, offset=0,
                             calls_required=enforcement.calls == "required")
    if masked is None and banned is None:
        return None
    return masked, banned
