"""A relayed body written to the client's socket as each piece arrives, below uvicorn's path of one
ASGI message a piece (~40 µs a piece on this CPU, ``scripts/bench_relay_layers.py``; at a toy's
380 tokens a second that is a share of the engine's decode on 2 cores).

What this takes of uvicorn beyond ASGI is named here and nowhere else: the httptools protocol's
request cycle (``RequestResponseCycle``), its ``transport``, and the framing it chose for the body
(``chunked_encoding``) once the head is sent; its ``disconnected`` and ``response_complete`` flags.
Without any of them the body goes as ASGI messages, as before (``usable()`` is False).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ClientSocket:
    """``byte_relay.DirectBody`` over one uvicorn request cycle."""

    cycle: Any  # uvicorn.protocols.http.httptools_impl.RequestResponseCycle

    def usable(self) -> bool:
        cycle = self.cycle
        return getattr(cycle, "chunked_encoding", None) is True and getattr(cycle, "response_started", False) and \
            not getattr(cycle, "response_complete", True) and not getattr(cycle, "disconnected", True) and \
            hasattr(getattr(cycle, "transport", None), "get_write_buffer_size")

    def write(self, piece: bytes) -> None:
        if piece and not self.cycle.disconnected and not self.cycle.transport.is_closing():
            self.cycle.transport.write(b"%x\r\n%b\r\n" % (len(piece), piece))

    def unsent(self) -> int:
        return self.cycle.transport.get_write_buffer_size()
