"""The floor under any relay written in Python: bytes from a client's connection to the engine's and
back, protocol to protocol on uvloop, with no HTTP parsing and no application at all. What it costs a
streamed token (its CPU, and the engine's decode through it) is what no front can go below on the
same machine; ``scripts/bench_router.py`` measures it beside serve's front.

    python scripts/bare_relay.py ENGINE_HOST ENGINE_PORT   (prints the port it listens on, then relays)
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

import uvloop


class EngineSide(asyncio.Protocol):
    """The engine's connection: what it sends goes to the client as it comes."""

    def __init__(self, client: asyncio.Transport):
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class ClientSide(asyncio.Protocol):
    """A client's connection: its bytes go to a new engine connection (opened on its first bytes)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.engine: asyncio.Transport | None = None
        self.waiting: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass of asyncio's)
        asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        engine, _ = await loop.create_connection(lambda: EngineSide(self.transport), self.host, self.port)
        self.engine = engine
        for data in self.waiting:
            engine.write(data)

    def data_received(self, data: bytes) -> None:
        if self.engine is None:
            self.waiting.append(data)
        else:
            self.engine.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.engine is not None:
            self.engine.close()


async def relay(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: ClientSide(host, port), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(relay(sys.argv[1], int(sys.argv[2])))
