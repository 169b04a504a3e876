"""A request whose client has gone stops being generated: mlx_lm.server notices a closed
connection only when it writes, and a whole (not streamed) reply writes once, at its end, so an
abandoned request with a large ``max_tokens`` would keep the engine busy to the last token."""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Callable
from typing import Any

EVERY_S = 0.25


class HangupWatch:
    """While the request runs, the client's socket is looked at every ``EVERY_S``: at its end of
    file (the client closed it), ``context()`` (the engine's ``GenerationContext``, once it exists)
    is told to stop."""

    def __init__(self, connection: socket.socket, context: Callable[[], Any]) -> None:
        self.connection, self.context = connection, context
        self.done = threading.Event()
        self.gone = False
        self.thread = threading.Thread(target=self._watch, name="hangup-watch", daemon=True)

    def __enter__(self) -> HangupWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=2)

    def _closed(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):  # reset, or closed under us: gone too
            return True

    def _watch(self) -> None:
        while not self.done.wait(EVERY_S):
            self.gone = self.gone or self._closed()
            context = self.context() if self.gone else None
            if context is not None:
                logging.warning("localchat: the client hung up; its reply is no longer generated")
                context.stop()
                return
