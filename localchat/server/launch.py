"""Launch ``mlx_lm.server`` as a child process, know when it is really ready, always stop it.

``/health`` answers "ok" before the model has loaded, so readiness is a 1-token chat completion
that succeeds. The child runs in its own session (Ctrl+C reaches only us; we stop it with
SIGTERM, then SIGKILL after a grace period) and, on Linux, dies with us even if we are killed.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from localchat.errors import LocalchatError, UsageError
from localchat.files import private_dirs
from localchat.fit.check import FitSettings, check_local, smaller_variants
from localchat.log_lines import is_error
from localchat.processes import SERVE_PID, SERVED_ID, child_preexec, stop_group
from localchat.registry import ModelRef, local_dir
from localchat.server.distributed import RANK_FAILED, Ranks, check_ranks, failed_rank, launch_command

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
GRACE_S = 5.0
READY_TIMEOUT_S = 600.0
POLL_S = 0.2
QUIET_PORTS = (20000, 32768)  # below every kernel's range for outgoing connections (see ``free_port``)


class ServerStartError(LocalchatError):
    """The server did not become ready; ``log_path`` is its log, when it had one. The terminal's
    line names the log; ``reason`` (without it) is what an HTTP reply may say: a local path is
    serve's own business, never a client's."""

    def __init__(self, message: str, log_path: Path | None = None):
        super().__init__(f"{message} (log: {log_path})" if log_path is not None else message)
        self.reason, self.log_path = message, log_path


def port_is_free(host: str, port: int) -> bool:
    """Bind as the server will (SO_REUSEADDR: a port in TIME-WAIT is free, a listener is not)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to, for a child to listen on in a moment. Picked below the ports the
    kernel gives outgoing connections (Linux 32768-60999, macOS 49152-65535): a port from
    ``bind(0)`` is one of those, and any connection opened on this machine meanwhile could take it
    before the child binds it ("address already in use"). The kernel's choice is the last resort."""
    for _ in range(64):
        port = random.randrange(*QUIET_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def failure_line(path: Path, since: int = 0) -> str:
    """What the child's log says went wrong, in one line: the rank that failed (a distributed
    server), then the log's last error-looking line (``ValueError: Model type foo not supported.``);
    never an ordinary log line presented as the cause. Only what was written from byte ``since``
    on is read: a log appended to by each load holds what earlier children wrote."""
    tail = last_lines(path, 200, since)
    lines = [line.strip() for line in tail.splitlines() if line.strip() and not RANK_FAILED.search(line)]
    cause = next((line for line in reversed(lines) if is_error(line)), "")
    cause = cause[:300]
    rank = failed_rank(tail)
    if rank:
        return f"{rank}; the log's last error: {cause}" if cause else f"{rank}; the log shows no error"
    return cause or (f"the log's last line: {lines[-1][:300]}" if lines else "(the log is empty)")


def last_lines(path: Path, n: int = 20, since: int = 0) -> str:
    """The log's last ``n`` lines from byte ``since`` on, without the colours mlx.launch writes."""
    try:
        with path.open("rb") as f:
            f.seek(since)
            lines = (line.decode("utf-8", errors="replace") for line in f)
            return SGR.sub("", "".join(deque(lines, maxlen=n)))
    except OSError:
        return ""


@dataclass
class RunningServer:
    process: subprocess.Popen
    host: str
    port: int
    model_location: str
    log_path: Path
    load_s: float = 0.0
    log_from: int = 0  # where this child's own output starts in its log (a reload appends)
    writes_id: bool = False  # our engine, told the id it is served by (``SERVED_ID``): it names the model so
    scratch: Path | None = None  # the ranks' temporary directory (see ``rank_scratch``), removed by ``stop``
    vision: bool = False  # mlx_vlm.server (its API has no plain-text completions)

    def failure(self) -> str:
        """What this child's own output says went wrong (never what an earlier child left)."""
        return failure_line(self.log_path, self.log_from)

    @property
    def root_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def stop(self, grace_s: float = GRACE_S) -> int | None:
        """SIGTERM to the child's whole process group (every rank of a distributed server is in
        it), then SIGKILL after ``grace_s``; returns once every rank has exited, with the child's
        exit code."""
        code = stop_group(self.process, grace_s)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return code


def server_command(model_location: str, host: str, port: int, extra_args: tuple[str, ...] = (),
                   ranks: Ranks | None = None, plain: bool = False, vision: bool = False) -> list[str]:
    """The command that starts mlx_lm.server: one process, or one a rank under ``mlx.launch``;
    with the grammar mask added (``serve.engine.enforcing``) unless ``plain``. A vision model gets
    ``mlx_vlm.server`` instead (OpenAI's API with pictures; its own structured output)."""
    entry = ["mlx_vlm.server"] if vision else ["mlx_lm", "server"] if plain else ["localchat.serve.engine.enforcing"]
    command = [sys.executable, "-m", *entry, "--model", model_location,
               "--host", host, "--port", str(port), *extra_args]
    return launch_command(ranks, command) if ranks is not None else command


def launch(model_location: str, *, host: str = "127.0.0.1", port: int = 8080, log_path: Path,
           extra_args: tuple[str, ...] = (), ranks: Ranks | None = None, plain: bool = False,
           vision: bool = False, env: dict[str, str] | None = None, append_log: bool = False) -> RunningServer:
    """Start the child (not yet ready: see ``wait_ready``)."""
    if not port_is_free(host, port):
        raise ServerStartError(f"port {port} on {host} is busy: stop what is using it, or pick "
                               "another with --port")
    command = server_command(model_location, host, port, extra_args, ranks, plain, vision)
    ensure_hub_cache()
    with open_log(log_path, append=append_log) as log:
        log_from = log.tell()
        scratch = rank_scratch() if ranks is not None else None
        try:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=server_env(distributed=ranks is not None, scratch=scratch) | (env or {}),
                                       start_new_session=True, preexec_fn=child_preexec(signal.SIGKILL))
        except BaseException:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            raise
    return RunningServer(process, host, port, model_location, log_path, log_from=log_from,
                         writes_id=not (plain or vision) and SERVED_ID in (env or {}), scratch=scratch, vision=vision)


def rank_scratch() -> Path:
    """A temporary directory for one group of ranks, removed when it stops: mlx.launch (0.32) has
    each local rank's shell ``mktemp`` a PID file and a host file and never removes either, so
    without it every ``--ranks`` start would leave two files a rank in the machine's /tmp."""
    return Path(tempfile.mkdtemp(prefix="localchat-ranks-"))


def server_env(*, distributed: bool, scratch: Path | None = None) -> dict[str, str]:
    """The server's environment: it never downloads, and its ranks know whom not to outlive and
    write their temporary files in ``scratch``. mlx.launch writes its ``Node with rank 1 exited
    with code -9`` a word at a time when Python is unbuffered, so another rank's output could land
    inside the number: its lines stay whole."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", SERVE_PID: str(os.getpid())}
    if distributed:
        env.pop("PYTHONUNBUFFERED", None)
    return env | ({"TMPDIR": str(scratch)} if scratch is not None else {})


def ensure_hub_cache() -> None:
    """mlx_lm.server (0.32) lists its models by scanning Hugging Face's cache, and without that
    directory ``/v1/models`` drops the connection after its headers (ml-explore/mlx-lm#1636): on a
    machine whose models all came from elsewhere (a GGUF, the demo), a client asking which models
    there are gets nothing. The empty directory is what Hugging Face would create on its first
    download. (Here, in ``launch``, for every way a server is started, tests' included.)"""
    from huggingface_hub.constants import HF_HUB_CACHE

    try:
        Path(HF_HUB_CACHE).mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # (a read-only home: /v1/models stays broken, the rest works)


def open_log(path: Path, append: bool = False):
    """The log, truncated (or appended to: a model the router loads again), never through a symlink;
    its directory created owner-only. Only a regular file: the log is read back to explain a
    failure, and a FIFO would block both ways."""
    try:
        if not path.parent.exists():
            private_dirs(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        why = "a pipe, not a file" if exc.errno == errno.ENXIO else exc.strerror or exc  # (a FIFO no one reads)
        raise ServerStartError(f"cannot open the server log {path}: {why}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ServerStartError(f"cannot open the server log {path}: a pipe or a device, not a file")
    os.set_blocking(fd, True)
    if append:
        os.lseek(fd, 0, os.SEEK_END)
    else:
        os.ftruncate(fd, 0)
    return os.fdopen(fd, "wb")


FAILURE_MARKS = ("generation thread died", "Traceback (most recent call last)", "Node with rank")
SGR = re.compile(r"\x1b\[[0-9;]*m")  # colour codes in a log (mlx.launch's warnings)


def _ready_once(client: httpx.Client, server: RunningServer) -> bool:
    """True once a 1-token completion succeeds. Raises ServerStartError when the server says it
    can never serve: /health answers 503 (its generation thread died, e.g. the model failed to
    load), or its log shows a traceback."""
    try:
        health = client.get(f"{server.root_url}/health")
    except httpx.HTTPError:
        health = None
    if (health is not None and health.status_code == 503) or _log_shows_failure(server):
        raise ServerStartError(f"mlx_lm.server failed to start: {server.failure()}", server.log_path)
    if health is None or health.status_code != 200:
        return False
    try:
        url, body = _one_token_request(server)
        reply = client.post(url, json=body)
        return reply.status_code == 200 and bool(reply.json().get("choices"))
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def _one_token_request(server: RunningServer) -> tuple[str, dict]:
    """The completion that proves a server ready: one token after the one-word prompt ``Hi``, as
    plain text (a chat template would put its system prompt before it: ~30 tokens, ~3 s of prefill
    on this CPU for SmolLM2), or as a chat for mlx_vlm.server, which serves chats only."""
    settings = {"model": server.model_location, "max_tokens": 1, "temperature": 0.0}
    if server.vision:
        return f"{server.base_url}/chat/completions", settings | {"messages": [{"role": "user", "content": "Hi"}]}
    return f"{server.base_url}/completions", settings | {"prompt": "Hi"}


def _log_shows_failure(server: RunningServer) -> bool:
    tail = last_lines(server.log_path, 200, server.log_from)
    return any(mark in tail for mark in FAILURE_MARKS)


def wait_ready(server: RunningServer, timeout_s: float = READY_TIMEOUT_S,
               on_poll: Callable[[float], None] = lambda _: None) -> float:
    """Poll until a 1-token chat completion succeeds; returns the seconds it took. A child that
    exits or reports a failure ends the wait at once (see ``_ready_once``)."""
    started = time.perf_counter()
    with httpx.Client(timeout=httpx.Timeout(30.0, connect=1.0)) as client:
        while True:
            elapsed = time.perf_counter() - started
            if server.process.poll() is not None:
                how = "stopped" if failed_rank(last_lines(server.log_path, 200, server.log_from)) else \
                    f"exited with code {server.process.returncode}"
                raise ServerStartError(f"mlx_lm.server {how} during start-up: {server.failure()}", server.log_path)
            if _ready_once(client, server):
                server.load_s = elapsed
                return elapsed
            if elapsed > timeout_s:
                raise ServerStartError(f"mlx_lm.server was not ready after {timeout_s:.0f}s: "
                                       f"{server.failure()}", server.log_path)
            on_poll(elapsed)
            time.sleep(POLL_S)


def default_log(port: int) -> Path:
    """The server's log in the user's own directory (created owner-only): a shared, predictable
    /tmp name could be planted as a symlink by another local user."""
    from localchat.home import home_dir

    return home_dir() / "logs" / f"server-{port}.log"


def serves_vision(ref: ModelRef, ranks: Ranks | None = None) -> bool:
    """Whether ``ref`` is served by mlx_vlm.server (the vision extra required; one machine only)."""
    from localchat.vision.support import is_vision, require_extra

    if not is_vision(ref):
        return False
    require_extra(f"serve -m {ref.id} (a vision model)")
    if ranks is not None:
        raise UsageError(f"--ranks is for mlx_lm.server: {ref.id} is a vision model, served by mlx_vlm.server "
                         "on one machine")
    return True


def start_ready(ref: ModelRef, *, host: str = "127.0.0.1", port: int, log: Path | None = None,
                extra: tuple[str, ...] = (), on_poll: Callable[[str], None] = lambda _: None,
                ranks: Ranks | None = None, fit: FitSettings | None = None, plain: bool = False,
                env: dict[str, str] | None = None, append_log: bool = False) -> RunningServer:
    """Launch mlx_lm.server for ``ref`` (on ``ranks``, when given) and wait until a completion
    succeeds through rank 0; ``on_poll`` hears what it is waiting for (a spinner shows it). The
    child, every rank of it, is stopped if anything goes wrong. A model that does not fit this
    machine's memory (``fit``) is refused before the server starts."""
    model_dir = local_dir(ref)  # fail early, in one line, when the model is not on this machine
    vision = serves_vision(ref, ranks)
    check_local(ref.id, model_dir, fit or FitSettings(), smaller_variants(ref))
    if ranks is not None:
        check_ranks(ranks, model_dir)
    server = launch(ref.location, host=host, port=port, log_path=log or default_log(port), extra_args=extra,
                    ranks=ranks, plain=plain, vision=vision, env=env, append_log=append_log)
    where = f" on {ranks.size} ranks ({ranks.backend})" if ranks is not None else ""
    name = "mlx_vlm.server" if vision else "mlx_lm.server"
    try:
        on_poll(f"starting {name} with {ref.id}{where} on port {port} …")
        wait_ready(server, on_poll=lambda s: on_poll(
            f"loading {ref.id} in {name}{where} … {s:.0f}s (waiting for a 1-token completion)"))
    except BaseException:
        server.stop()
        raise
    return server


