"""The mask, as an mlx_lm logits processor: ``(tokens so far, logits) → logits`` with every token
that would not keep the answer a valid prefix set to minus infinity.

The reply is read in regions, from the token ids alone: a thinking model's reasoning is free (the
mask starts where the answer starts, after the close marker; at the very start, the open marker is
allowed beside the answer's first tokens), the answer follows the answer's grammar, and a tool call
after its start marker follows the calls' grammar. mlx_lm calls the processor once a decoding
step, and with a draft model once a proposed position, so the token list may grow, or shrink back
after a rejected draft: the matchers are kept in step with it (llguidance rolls back), and the
target model decides under the mask. A mask that leaves no token allowed ends the turn
(``DeadEnd``).

Where the time goes: mlx_lm calls the processor with the step's forward pass built but not run.
The pass is set running first and the mask computed while it runs, which needs the token chosen
last: read from the sampler (``MaskedDecoding.sampler``), where it is ready by then. Read from
the token list instead, it would wait for the whole pass, queued before it. On a GPU the whole
pass can hide the mask (not measured: no Metal here); on a CPU, MLX keeps a few tasks ahead of the
thread that queues them, so the mask overlaps with the last of them, and the pass leaves the
matcher's tables out of the caches: a mask costs several times what it costs alone. Where the
grammar forces the next tokens (a key, its colon), they are let through without the matcher
(``bench_constrained.py`` measures all this).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from localchat.errors import LocalchatError
from localchat.grammar.compile import Grammars


class DeadEnd(LocalchatError):
    """The grammar allows no next token (or the model's tokens left it): the turn ends here."""


@dataclass
class Reasoning:
    """A think format's markers as token ids, and whether the prompt opened the block."""

    open_ids: tuple[int, ...]
    close_ids: tuple[int, ...]
    opened: bool = False


@dataclass
class _Tracked:
    """A matcher, the tokens it has consumed (what the next call is compared with) and the tokens
    its grammar forces after them (llguidance's fast-forward tokens: a key, a colon, a closing
    brace), which are let through without a call into the matcher."""

    matcher: Any
    consumed: list[int] = field(default_factory=list)
    ahead: list[int] = field(default_factory=list)

    def forced_next(self, tokens: list[int]) -> int | None:
        """The token the grammar forces next, when ``tokens`` only went on along what it forced."""
        done = len(self.consumed)
        went = len(tokens) - done
        if 0 <= went < len(self.ahead) and tokens[done:] == self.ahead[:went] and tokens[:done] == self.consumed:
            return self.ahead[went]
        return None

    def follow(self, tokens: list[int]) -> None:
        """Consume ``tokens``, rolling back what no longer matches them; once the grammar has ended
        (a call's end marker), what follows is not its own."""
        self.ahead = []
        same = len(self.consumed)
        if tokens[:same] != self.consumed:  # (compared whole first: a rollback is rare)
            same = next(i for i, (a, b) in enumerate(zip(self.consumed, tokens + [None])) if a != b)
        if same < len(self.consumed):
            self.matcher.rollback(len(self.consumed) - same)
            del self.consumed[same:]
        for token in tokens[same:]:
            if self.matcher.is_stopped():
                break
            self.matcher.consume_token(token)
            self.consumed.append(token)


class MaskedDecoding:
    """One reply's processor; ``offset`` is how many leading ids of the list mlx_lm passes are not
    the reply's (the prompt it fed; 1 with a draft model); ``decode`` reads ids as text."""

    def __init__(self, llg: Any, grammars: Grammars, *, offset: int, decode: Any, reasoning: Reasoning | None = None,
                 drafting: bool = False):
        from llguidance import LLMatcher

        self.llg, self.grammars, self.offset, self.decode, self.reasoning = llg, grammars, offset, decode, reasoning
        self.drafting = drafting  # with a draft model the list may shrink back: read it whole each time
        self._reply: list[int] = []
        self._answer = _Tracked(LLMatcher(llg, grammars.answer)) if grammars.answer else None
        self._calls: dict[int, _Tracked] = {}  # a call's matcher, by where its tokens start
        self._marker_at: dict[tuple[int, ...], bool] = {}  # whether a window of tokens ends with a start marker
        self._eos = frozenset(llg.eos_tokens)
        self._bitmask = _new_bitmask(llg.vocab_size)  # filled in place at each step
        self._as_mlx = _MaskArrays()
        self._chosen: Any = None  # the token the sampler chose last, when it is wrapped (``sampler``)
        self._reads_sampler = False
        self.mask_s, self.masked = 0.0, 0

    def sampler(self, inner: Any) -> Any:
        """``inner``, remembering the token it chooses, for the next step to read (see the module's
        docstring). With a draft model the sampler also picks the draft's tokens: the list is read."""
        if self.drafting:
            return inner

        def sample(logprobs: Any) -> Any:
            self._chosen = inner(logprobs)
            return self._chosen

        self._reads_sampler = True
        return sample

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        if not self._reads_sampler:
            self._read(tokens)  # before the pass is queued: read after it, the list waits for it
        mx.async_eval(logits)
        if self._reads_sampler and self._chosen is not None:
            self._reply.append(self._chosen.item())  # ready: the pass queued behind it needed it
            self._chosen = None
        reply = self._reply
        started = time.perf_counter()
        allowed = self._allowed(reply)
        if allowed is None:
            return logits
        out = self._apply(allowed, logits)
        self.mask_s += time.perf_counter() - started
        self.masked += 1
        return out

    def _read(self, tokens: Any) -> None:
        """The reply's ids so far, from the list mlx_lm passes; without a draft it only grows, one
        id a step."""
        size = tokens.size - self.offset
        if not self.drafting and size == len(self._reply) + 1:
            self._reply.append(tokens[-1].item())
        elif size != len(self._reply) or self.drafting:
            self._reply = tokens.tolist()[self.offset:] if size > 0 else []

    def _allowed(self, reply: list[int]) -> Any:
        """The next token's bitmask (numpy), or None when the next token is free."""
        start, forced = self._answer_start(reply)
        if forced is not None:
            return self._only(forced)
        if start is None:
            return None
        answer = reply[start:]
        if self._answer is not None:
            return self._mask_of(self._answer, answer, also=self._open_marker(start, answer))
        call = self._open_call(answer)
        return self._mask_of(call[0], answer[call[1]:]) if call else None

    def _answer_start(self, reply: list[int]) -> tuple[int | None, int | None]:
        """Where the answer starts in ``reply`` (None: still reasoning), or the marker token that
        must come next (an open marker begun)."""
        r = self.reasoning
        if r is None:
            return 0, None
        inside = r.opened
        if not inside and reply[:len(r.open_ids)] == list(r.open_ids):
            inside, after = True, len(r.open_ids)
        elif not inside and 0 < len(reply) < len(r.open_ids) and reply == list(r.open_ids[:len(reply)]):
            return None, r.open_ids[len(reply)]
        else:
            after = 0
        if not inside:
            return 0, None
        close = _find(reply, r.close_ids, after)
        return (close + len(r.close_ids), None) if close is not None else (None, None)

    def _open_marker(self, start: int, answer: list[int]) -> int | None:
        """At the very start of a reply that could think, the open marker's first token too."""
        r = self.reasoning
        return r.open_ids[0] if r is not None and not r.opened and start == 0 and not answer else None

    def _open_call(self, answer: list[int]) -> tuple[_Tracked, int] | None:
        """The call being written (its matcher, where its tokens start), if a start marker came last
        and its call has not ended yet."""
        markers = self.grammars.markers
        if markers is None or self.grammars.call is None:
            return None
        starts = [position + 1 for position in range(len(answer)) if self._ends_marker(answer, position, markers.start)]
        if not starts:
            return None
        begin = starts[-1]
        tracked = self._calls.setdefault(begin, self._new_call())
        tracked.follow(answer[begin:])
        return None if tracked.matcher.is_accepting() else (tracked, begin)

    def _ends_marker(self, answer: list[int], position: int, marker: str) -> bool:
        """Whether the token at ``position`` completes the start marker (remembered by the tokens
        themselves: a rejected draft may put others at the same place)."""
        window = tuple(answer[max(0, position - len(marker)):position + 1])
        if window not in self._marker_at:
            self._marker_at[window] = self.decode(list(window)).endswith(marker)
        return self._marker_at[window]

    def _new_call(self) -> _Tracked:
        from llguidance import LLMatcher

        assert self.grammars.call is not None  # (a call starts only where the grammars have one)
        return _Tracked(LLMatcher(self.llg, self.grammars.call))

    def _mask_of(self, tracked: _Tracked, tokens: list[int], also: int | None = None) -> Any:
        import llguidance.numpy as llg_numpy

        if tokens and tokens[-1] in self._eos:
            return None  # the reply has ended: this step's token is never used
        forced = tracked.forced_next(tokens)
        if forced is not None:
            return self._only(forced)
        tracked.follow(tokens)
        matcher = tracked.matcher
        if matcher.is_error():  # (an errored matcher says it has stopped, too)
            raise DeadEnd(f"the reply left the format it must follow ({_first_line(matcher.get_error())})")
        if matcher.is_stopped():  # the answer is whole: only its end may follow
            return self._only(*self._eos)
        if also is None:
            tracked.ahead = matcher.compute_ff_tokens()
            if tracked.ahead:
                return self._only(tracked.ahead[0])
        mask = self._bitmask
        llg_numpy.fill_next_token_bitmask(matcher, mask)
        if also is not None:
            _set_bit(mask, also)
        if not mask.any():
            raise DeadEnd("the format allows no next token here: the answer cannot go on")
        return mask

    def _only(self, *tokens: int) -> Any:
        mask = self._bitmask
        mask[:] = 0
        for token in tokens:
            _set_bit(mask, token)
        return mask

    def _apply(self, bitmask: Any, logits: Any) -> Any:
        """Tokens outside the bitmask to minus infinity."""
        import mlx.core as mx

        return mx.where(self._as_mlx.allowed(bitmask, logits.shape[-1]), logits, self._as_mlx.minus_inf(logits.dtype))


class _MaskArrays:
    """Bitmasks as MLX arrays of allowed tokens, one a distinct bitmask: a reply under a grammar
    meets the same few again and again (inside a string, at each key), and a copy into MLX costs
    more than looking one up. A vocabulary's padding rows past the bitmask are never allowed."""

    BUDGET = 16 << 20  # bytes of MLX arrays kept (4 KB a mask for the demo, 48 KB for SmolLM2)

    def __init__(self):
        self._arrays: dict[bytes, Any] = {}
        self._minus_inf: Any = None

    def allowed(self, bitmask: Any, width: int) -> Any:
        key = bitmask.tobytes()
        found = self._arrays.get(key)
        if found is None or found.size != width:
            found = self._arrays[key] = _unpacked(bitmask, width)
            if len(self._arrays) * width > self.BUDGET:
                del self._arrays[next(iter(self._arrays))]  # the oldest
        return found

    def minus_inf(self, dtype: Any) -> Any:
        import mlx.core as mx

        if self._minus_inf is None or self._minus_inf.dtype != dtype:
            self._minus_inf = mx.array(-float("inf"), dtype=dtype)
        return self._minus_inf


def _unpacked(bitmask: Any, width: int) -> Any:
    """The bitmask's bits as MLX booleans, ``width`` of them (unpacked in numpy: 70 µs for SmolLM2's
    49,152 tokens, where gathering them in MLX ops took 470 µs)."""
    import mlx.core as mx
    import numpy as np

    bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")
    if bits.size < width:
        bits = np.pad(bits, (0, width - bits.size))
    return mx.array(bits[:width].view(np.bool_))


def _new_bitmask(vocab_size: int) -> Any:
    import llguidance.numpy as llg_numpy

    return llg_numpy.allocate_token_bitmask(1, vocab_size)


def _set_bit(mask: Any, token: int) -> None:
    """Allow ``token`` in a bitmask of int32 words (bit 31 set through an unsigned view)."""
    import numpy as np

    mask.view(np.uint32)[0, token // 32] |= np.uint32(1 << (token % 32))


def _find(ids: list[int], marker: tuple[int, ...], start: int) -> int | None:
    n = len(marker)
    for i in range(start, len(ids) - n + 1):
        if tuple(ids[i:i + n]) == marker:
            return i
    return None


def _first_line(text: str) -> str:
    return " ".join(text.strip().splitlines()[0].split())[:200] if text.strip() else "no reason given"
