"""A model the router serves: the names a request may call it by, what it is estimated to take,
and where it is now (its engine child, its requests in flight, when it was last used)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from localchat.fit.estimate import KVSettings
from localchat.registry import ModelRef

if TYPE_CHECKING:
    from localchat.serve.pool.upstream import Upstream
    from localchat.server.launch import RunningServer

UNLOADED, LOADING, LOADED, UNLOADING = "unloaded", "loading", "loaded", "unloading"


@dataclass
class ServedModel:
    key: str  # the id it is listed by
    names: frozenset[str]  # every name a request may use: id, aliases, repo id, path
    ref: ModelRef | None = None  # None: a model served elsewhere (``--upstream NAME=URL``)
    estimate: int = 0  # the bytes admission counts (the fit estimate at the context it serves)
    remote: Upstream | None = None
    pinned: bool = False
    log_path: str = ""
    state: str = UNLOADED
    server: RunningServer | None = None
    upstream: Upstream | None = None
    in_flight: int = 0
    waiting: int = 0  # requests waiting for it to load (or for room to load it)
    last_used: float = 0.0  # monotonic: when its last request ended
    loaded_at: float | None = None  # wall clock: when it became ready
    keep_alive: float | None = 300.0  # seconds idle before it is unloaded (the last request's); None: never
    drain_until: float = 0.0  # monotonic: new requests wait while a load waits for this one to go
    loads: int = 0
    listed: tuple[str, ...] = ()  # the ids /v1/models shows for it (an unnamed upstream's own); () its key
    kv: KVSettings = KVSettings()  # its KV cache's bits, group and start (``serve --kv-bits``)

    @property
    def holds_memory(self) -> bool:
        return self.remote is None and self.state != UNLOADED

    @property
    def busy(self) -> bool:
        return self.in_flight > 0 or self.state in (LOADING, UNLOADING)

    @property
    def child_ended(self) -> bool:
        return self.state == LOADED and self.server is not None and self.server.process.poll() is not None


def names_of(ref: ModelRef) -> frozenset[str]:
    """What a client may send as ``model`` for ``ref``: as ``chat -m`` takes it (id, alias, repo id,
    path), and the location localchat's own client sends."""
    names = {ref.id, ref.location}
    if ref.entry is not None:
        names |= {ref.entry.id, *ref.entry.aliases, ref.entry.source}
    return frozenset(n for n in names if n)
