"""A saved session's KV cache: written with ``/save``, loaded with ``--resume`` when it still fits.

Both directions end in one line for the user: what was written (and what the cap evicted), or
what was loaded, or why nothing was. A cache that is missing, stale or damaged never stops a
resume: the first turn prefills the whole prompt, as it would without one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

from typing_extensions import TypeIs

from localchat.conversation.turn import ChatSession
from localchat.errors import LocalchatError
from localchat.sizes import shown_size
from localchat.store.kv_files import CacheFiles, read_metadata

PROBE = "…"  # a stand-in next message: what the template renders before it is what the cache must hold


@dataclass(frozen=True)
class CacheWrite:
    tokens: int = 0
    size: int | None = None  # None: nothing kept
    evicted: tuple[str, ...] = ()
    problem: str | None = None

    def describe(self) -> str:
        if self.problem:
            return f"its KV cache was not kept: {self.problem}"
        evicted = f"; evicted the oldest: {', '.join(self.evicted)}" if self.evicted else ""
        return f"with its KV cache ({self.tokens} tokens, {shown_size(self.size or 0)}){evicted}"


@dataclass
class SessionCaches:
    """Where the caches go and whether this session writes them (``--no-save-cache``: no)."""

    files: CacheFiles
    write: bool = True


class CacheHolder(Protocol):
    """A backend that keeps a KV cache a session can save and restore (the in-process one)."""

    cache_reuse: bool

    def held_cache(self) -> tuple[Any, list[int]]: ...

    def adopt_cache(self, cache: Any, ids: list[int]) -> None: ...

    def encode(self, messages: list[Any], think: bool | None = None) -> list[int]: ...


def holds_cache(backend: Any) -> TypeIs[CacheHolder]:
    return hasattr(backend, "adopt_cache")


def write_cache(session: ChatSession, uid: str, name: str, caches: SessionCaches) -> CacheWrite | None:
    """Write the backend's cache as ``name``'s (None when this backend keeps none, or when told not
    to: then an older file of that name, no longer describing this save, is removed)."""
    from localchat.backends import saved_cache

    backend = session.backend
    held = backend.held_cache()[1] if holds_cache(backend) else []
    if not caches.write or not held:
        with contextlib.suppress(LocalchatError):  # left behind, it is still only a prefix cache
            caches.files.remove(name)
        return None
    try:
        caches.files.prepare()
        size = saved_cache.save(backend, uid, caches.files.temp_for(name), caches.files.path_for(name))
        evicted = tuple(caches.files.evict(keep=name))
    except LocalchatError as exc:  # the directory cannot be used (a link, a file in its place)
        return CacheWrite(problem=str(exc))
    except (OSError, RuntimeError, ValueError) as exc:
        with contextlib.suppress(LocalchatError):
            caches.files.remove(name)  # an older file would no longer describe this save
        return CacheWrite(problem=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if name in evicted:
        return CacheWrite(problem=f"at {shown_size(size)} it is over the cap of {shown_size(caches.files.max_bytes)} "
                                  "(--cache-max-bytes or cache_max_bytes in config.yaml)",
                          evicted=tuple(e for e in evicted if e != name))
    return CacheWrite(tokens=len(held), size=size, evicted=evicted)


def restore_cache(session: ChatSession, uid: str, name: str, files: CacheFiles) -> str | None:
    """Load ``name``'s saved cache into the session's backend; the line to show (None for a
    backend that keeps no cache here, e.g. a server)."""
    from mlx_lm.models.cache import can_trim_prompt_cache

    from localchat.backends.saved_cache import CacheUnusable, load

    backend = session.backend
    if not holds_cache(backend):
        return None
    try:
        path = files.existing(name)
    except LocalchatError as exc:
        return f"saved KV cache not used: {exc}; the first turn prefills the whole prompt"
    if path is None:
        return "no saved KV cache (saved without one, or evicted): the first turn prefills the whole prompt"
    if not backend.cache_reuse:
        return "saved KV cache not used: --no-cache-reuse prefills every turn's whole prompt"
    try:
        try:
            metadata = read_metadata(path)
        except (OSError, ValueError) as exc:
            raise CacheUnusable(f"it is damaged ({exc})") from None
        restored = load(backend, uid, path, metadata)
        matched = _matching_tokens(session, restored.ids)
        if matched == 0 or (matched < len(restored.ids) and not can_trim_prompt_cache(restored.cache)):
            raise CacheUnusable("the chat template renders the saved turns differently before a new message, "
                                "and this cache cannot be cut back to what still matches")
    except CacheUnusable as exc:
        return f"saved KV cache not used: {exc}; the first turn prefills the whole prompt"
    backend.adopt_cache(restored.cache, restored.ids)
    held, size = len(restored.ids), f"{shown_size(path.stat().st_size)} in {restored.seconds:.2f}s"
    if matched >= held:
        return f"KV cache loaded: {held} tokens, {size}; the first turn prefills only what is new"
    return (f"KV cache loaded ({size}), but only {matched} of its {held} tokens still match the prompt the template "
            f"renders now ({_why_parted(session, held, matched)}): the first turn prefills from token {matched} on")


def _why_parted(session: ChatSession, held: int, matched: int) -> str:
    """Where the saved tokens and the prompt part, said: within the last reply is usual (its text,
    read back as history, is tokenized anew, and BPE need not give back the tokens the model chose),
    before it something changed."""
    turns = session.conversation.turns
    reply = turns[-1].stats.completion_tokens if turns and turns[-1].stats is not None else 0
    if reply and matched >= held - reply:
        return "the last reply, read back as history, is other tokens than the model generated: usual, nothing changed"
    return "the system message, the tools offered or the template changed since?"


def _matching_tokens(session: ChatSession, held: list[int]) -> int:
    """How many of the held tokens the next prompt starts with (rendered with a stand-in message)."""
    from localchat.backends.inproc import common_prefix_length

    backend = session.backend
    if not holds_cache(backend):
        return 0
    try:
        prompt = backend.encode(session.preview(PROBE), session.params.think)
    except LocalchatError:
        return len(held)  # the template refuses something: the first turn will say so
    return common_prefix_length(held, prompt)
