"""A Hugging Face Hub of our own on loopback, for the real ``huggingface_hub`` client
(``HF_ENDPOINT`` points at it): the model-info, resolve (HEAD, GET, byte ranges) and
safetensors-header requests the client makes, over copies of model directories.

By hand, serving the bundled toys (and SmolLM2 when it has been imported) as ``localchat-test/*``:

    uv run python tests/fake_hub.py --port 8765
    HF_ENDPOINT=http://127.0.0.1:8765 uv run localchat pull localchat-test/demo

Repos can misbehave, for the fault tests: ``gated`` (401), ``drop_after`` (the connection closes
once after that many bytes of a file), ``corrupt`` (a file's bytes differ from the sha256 its
metadata gives), ``rate`` (bytes per second, so a download can be caught mid-file), and
``claimed`` (sizes the model info claims instead of the real ones: a repo larger than any disk).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    gated: bool = False
    drop_after: int | None = None  # close the connection once, after this many bytes of a file
    corrupt: str | None = None  # this file's last bytes are served flipped
    rate: int | None = None  # bytes per second
    claimed: dict[str, int] = field(default_factory=dict)
    stall_s: float = 0.0  # the model info answers only after this long
    trickle_s: float = 0.0  # the model info comes a byte at a time, this long apart
    siblings: list[dict] = field(default_factory=list)  # listed besides the files; "@raw:X@" is written as X
    dropped: set[str] = field(default_factory=set)
    gets: list[tuple[str, str | None]] = field(default_factory=list)  # (file, Range header)

    @property
    def sha(self) -> str:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + _etag(name, self.files[name]).encode())
        return digest.hexdigest()


def repo_from_dir(path: Path, **faults) -> FakeRepo:
    return FakeRepo(files={p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}, **faults)


def _is_lfs(name: str) -> bool:
    return name.endswith(LFS_SUFFIXES)


def _etag(name: str, data: bytes) -> str:
    if _is_lfs(name):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status, headers={"X-Error-Code": code, "X-Error-Message": message})


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.app = Starlette(routes=[
            Route("/api/models/{owner}/{name}", self.info),
            Route("/api/models/{owner}/{name}/revision/{revision:path}", self.info),
            Route("/{owner}/{name}/resolve/{revision}/{file:path}", self.resolve, methods=["GET", "HEAD"]),
        ])

    def _repo(self, request: Request) -> FakeRepo | Response:
        repo = self.repos.get(f"{request.path_params['owner']}/{request.path_params['name']}")
        if repo is None:
            return _error(404, "RepoNotFound", "Repository not found")
        if repo.gated and "authorization" not in request.headers:
            return _error(401, "GatedRepo", "Access to this model is restricted: you must be authenticated")
        return repo

    async def info(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, Response):
            return repo
        await asyncio.sleep(repo.stall_s)
        siblings = []
        for name, data in repo.files.items():
            size = repo.claimed.get(name, len(data))
            sibling = {"rfilename": name, "size": size, "blobId": hashlib.sha1(data).hexdigest()}
            if _is_lfs(name):
                sibling["lfs"] = {"sha256": _etag(name, data), "size": size, "pointerSize": 134}
            siblings.append(sibling)
        siblings += repo.siblings
        repo_id = f"{request.path_params['owner']}/{request.path_params['name']}"
        return _json({"_id": repo_id, "id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False,
                             "gated": "manual" if repo.gated else False, "disabled": False, "siblings": siblings,
                             "tags": ["mlx"], "library_name": "mlx", "downloads": 0, "likes": 0,
                             "lastModified": "2026-12-01T00:00:00.000Z", "createdAt": "2026-12-01T00:00:00.000Z",
                             "usedStorage": sum(len(d) for d in repo.files.values())}, repo.trickle_s)

    async def resolve(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, Response):
            return repo
        name = request.path_params["file"]
        if name not in repo.files:
            return _error(404, "EntryNotFound", f"{name} does not exist")
        data = repo.files[name]
        headers = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        etag = _etag(name, data)
        headers["ETag"] = f'"{etag}"'
        if _is_lfs(name):
            headers["X-Linked-Etag"] = f'"{etag}"'
            headers["X-Linked-Size"] = str(len(data))
        if request.method == "HEAD":
            return Response(b"", headers={**headers, "Content-Length": str(len(data))})
        repo.gets.append((name, request.headers.get("range")))
        start, end = _range(request.headers.get("range"), len(data))
        body = data if name != repo.corrupt else data[:-64] + bytes(b ^ 0xFF for b in data[-64:])  # the tail
        status = 206 if request.headers.get("range") else 200
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        headers["Content-Length"] = str(end - start)
        cut = None
        if repo.drop_after is not None and name not in repo.dropped and start + repo.drop_after < end:
            repo.dropped.add(name)
            cut = start + repo.drop_after
        return StreamingResponse(_chunks(body, start, end, cut, repo.rate), status, headers=headers)


def _json(body: dict, trickle_s: float) -> Response:
    """The JSON as written (NaN and Infinity too, a ``"@raw:X@"`` string as the bare X), at once or
    trickled a byte at a time."""
    text = re.sub(r'"@raw:(.*?)@"', r"\1", json.dumps(body)).encode()
    if not trickle_s:
        return Response(text, headers={"Content-Type": "application/json"})

    async def trickle():
        for at in range(len(text)):
            yield text[at:at + 1]
            await asyncio.sleep(trickle_s)

    return StreamingResponse(trickle(), headers={"Content-Type": "application/json"})


def _range(header: str | None, size: int) -> tuple[int, int]:
    if not header or not header.startswith("bytes="):
        return 0, size
    first, _, last = header[6:].split(",")[0].partition("-")
    start = int(first or 0)
    end = min(int(last) + 1, size) if last else size
    return min(start, size), end


async def _chunks(body: bytes, start: int, end: int, cut: int | None, rate: int | None):
    step = 16384 if rate is None else max(1, rate // 20)
    for at in range(start, end, step):
        stop = min(at + step, end)
        if cut is not None and stop > cut:
            yield body[at:cut]
            raise ConnectionResetError("the fake hub drops the connection")  # uvicorn closes the socket
        yield body[at:stop]
        if rate is not None:
            await asyncio.sleep(0.05)


class RunningHub:
    """The hub served by uvicorn in a thread of this process, on a free port."""

    def __init__(self, hub: FakeHub, port: int = 0) -> None:
        import socket

        import uvicorn

        self.hub = hub
        sock = socket.socket()
        sock.bind(("127.0.0.1", port))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(hub.app, log_level="error", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        while not self._server.started:
            threading.Event().wait(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)


def toys_hub() -> FakeHub:
    """The bundled toys and, when imported on this machine, SmolLM2, as ``localchat-test/*``."""
    from localchat.registry import local_dir, resolve

    hub = FakeHub()
    for name in ("demo", "demo-tools", "smollm2"):
        try:
            hub.repos[f"localchat-test/{name}"] = repo_from_dir(local_dir(resolve(name)))
        except Exception:  # SmolLM2 not imported yet: the toys alone
            continue
    return hub


def main() -> None:
    parser = argparse.ArgumentParser(description="serve the bundled models as a Hugging Face Hub on loopback")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    hub = toys_hub()
    running = RunningHub(hub, args.port)
    print(f"serving {', '.join(hub.repos)} at {running.url}; export HF_ENDPOINT={running.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        running.stop()


if __name__ == "__main__":
    main()
