"""Which server answers a request: the gateway asks its routes for a lease on the model a request
names, and gives it back when the reply has ended (a router counts what is in flight and may load
the model first). ``FixedRoute`` is one server for every name: ``localchat gateway --upstream``."""

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


@dataclass
class FixedRoute:
    """One server behind the gateway, whatever a request names (clients name models of their own)."""

    upstream: Upstream

    def lease(self, name: str, keep_alive: Any = None) -> Lease:
        return Lease(upstream=self.upstream)

    def model_ids(self) -> list[str]:
        """The gateway's model, or, in front of a server whose model it was not told, the ids that
        server lists (never a local path)."""
        if self.upstream.named:
            return [self.upstream.model_id]
        return sorted(name for name in self.upstream.served if not name.startswith("/")) or ["default_model"]

    def health_upstream(self) -> Upstream | None:
        return self.upstream

    def status(self) -> dict[str, Any]:
        return {"models": [], "upstream": self.upstream.base_url}
