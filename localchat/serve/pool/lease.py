"""Which server answers a request: the front asks the pool for a lease on the model a request names,
and gives it back when the reply has ended (the pool counts what is in flight and may load the model
first). ``Routes`` is what the front needs of the pool."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from localchat.serve.pool.upstream import Upstream


@dataclass
class Lease:
    """A model's server, held for one request; ``release`` (once, whatever happens) gives it back."""

    upstream: Upstream
    loaded_s: float | None = None  # the request waited this long for its model to load
    room_s: float | None = None  # and this long for room to load it (busy models, unloads)
    on_release: Callable[[], None] = lambda: None
    _released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        if not self._released.is_set():
            self._released.set()
            self.on_release()


class Routes(Protocol):
    def lease(self, name: str, keep_alive: Any = None) -> Lease:
        """The server for ``name``, blocking while it loads; an ``ApiError`` (404, 503) when none can answer."""

    def model_ids(self) -> list[str]:
        """The names ``/v1/models`` lists."""

    def health_upstream(self) -> Upstream | None:
        """The server whose ``/health`` this port answers with, or None: the port answers itself."""

    def status(self) -> dict[str, Any]:
        """What ``localchat ps`` shows."""
