"""Where a relay's CPU a streamed chunk goes, layer by layer, against a scripted engine (no model):
128 SSE chunks 2.5 ms apart (a toy's decode speed), each relay in a process of its own, its CPU
read from /proc (Linux) over the same requests, in rotation.

    uv run python scripts/bench_relay_layers.py [--rounds 4] [--requests 10]

1. ``bare``: uvloop protocol to protocol, no HTTP (``scripts/bare_relay.py``): the floor.
2. ``uvicorn``: uvicorn (httptools, uvloop) with a plain ASGI app that sends each piece as it is read.
3. ``starlette``: the same behind a Starlette route and its ``StreamingResponse`` (serve's front
   is this layer plus its guards and counting).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import statistics
import time
from typing import Any

from bench_router import BareRelay, cpu_seconds  # (this directory: the script's own)

from localchat.server.launch import free_port

CHUNK = b'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":" word"}}],"model":"demo"}\n\n'
CHUNKS, GAP_S = 128, 0.0025


def scripted_engine(ports: Any) -> None:
    """An HTTP/1.0 answer of ``CHUNKS`` chunks, ``GAP_S`` apart, to every connection (one at a time)."""
    listener = socket.create_server(("127.0.0.1", 0))
    ports.put(listener.getsockname()[1])
    while True:
        client, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.recv(1 << 16)
        client.sendall(b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
        due = time.perf_counter()
        for _ in range(CHUNKS):
            due += GAP_S
            while time.perf_counter() < due:
                pass
            client.sendall(CHUNK)
        client.close()


async def engine_body(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    await reader.readuntil(b"\r\n\r\n")
    return reader, writer


def uvicorn_app(engine_port: int) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        reader, writer = await engine_body(engine_port)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        while piece := await reader.read(1 << 16):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        writer.close()

    return app


def starlette_app(engine_port: int) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def relayed(request: Request) -> StreamingResponse:
        reader, writer = await engine_body(engine_port)

        async def pieces() -> Any:
            try:
                while piece := await reader.read(1 << 16):
                    yield piece
            finally:
                writer.close()

        return StreamingResponse(pieces(), media_type="text/event-stream")

    return Starlette(routes=[Route("/", relayed, methods=["POST"])])


def served(layer: str, engine_port: int, port: int) -> None:
    import uvicorn

    app = uvicorn_app(engine_port) if layer == "uvicorn" else starlette_app(engine_port)
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
                lifespan="off")


def fetched(port: int) -> None:
    """One whole answer, read as a client reads it (no parsing: the client's cost is not measured)."""
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(b"POST / HTTP/1.1\r\nHost: relay\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        while client.recv(1 << 16):
            pass


def started(layer: str, engine_port: int) -> tuple[Any, int]:
    if layer == "bare":
        bare = BareRelay(f"http://127.0.0.1:{engine_port}")
        return bare.proc, int(bare.url.rsplit(":", 1)[1])
    port = free_port()
    process = multiprocessing.Process(target=served, args=(layer, engine_port, port), daemon=True)
    process.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return process, port
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{layer} did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args()
    ports: Any = multiprocessing.Queue()
    engine = multiprocessing.Process(target=scripted_engine, args=(ports,), daemon=True)
    engine.start()
    engine_port = ports.get()
    relays = {layer: started(layer, engine_port) for layer in ("bare", "uvicorn", "starlette")}
    try:
        for _, port in relays.values():
            fetched(port)  # (warm)
        spent: dict[str, list[float]] = {layer: [] for layer in relays}
        for _ in range(args.rounds):
            for layer, (process, port) in relays.items():
                before = cpu_seconds(process.pid)
                for _ in range(args.requests):
                    fetched(port)
                spent[layer].append((cpu_seconds(process.pid) - before) / args.requests / CHUNKS * 1e6)
    finally:
        for process, _ in relays.values():
            process.kill()
        engine.kill()
    print(f"CPU a chunk (µs, {CHUNKS} chunks {GAP_S * 1e3:.1f} ms apart, {args.requests} requests × {args.rounds} "
          "rounds, Linux CPU; per-request costs included)")
    floor = statistics.median(spent["bare"])
    for layer, figures in spent.items():
        median = statistics.median(figures)
        print(f"  {layer:<10} median {median:5.0f} µs ({median / floor:.2f}× the bare relay's) · rounds "
              f"{', '.join(f'{f:.0f}' for f in figures)}")


if __name__ == "__main__":
    main()
