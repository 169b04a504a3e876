"""mlx_lm.server on several ranks, started by MLX's own launcher (``mlx.launch``).

localchat writes no distributed code: ``mlx.launch`` starts one ``mlx_lm.server`` per rank (ring
over TCP, ``jaccl`` over Thunderbolt 5 RDMA, ``mpi``, ``nccl`` on CUDA), and mlx_lm shards the model
itself (tensor parallel, or ``--pipeline``); rank 0 serves HTTP. What localchat adds is what it does
for one server: a command shown before it runs, checks before anything starts (the model's heads
must split evenly across the ranks), readiness through rank 0, one line naming the rank that
failed, and every rank stopped (they share the launcher's process group).
"""

from __future__ import annotations

import importlib
import re
import shutil
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from localchat.errors import UsageError
from localchat.files import read_json_setting
from localchat.registry import read_config

BACKENDS = ("ring", "jaccl", "mpi", "nccl")
MAX_RANKS = 64  # beyond this a typo (each local rank is a process holding its shard)
# (a code must end the word: another rank's output written into the middle of the launcher's
# line, "code -9" + "2026-12-04 …", is read as an exit of unknown code, not as signal 92026)
RANK_FAILED = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)(?=\s|$)|(was killed|exited))")


@dataclass(frozen=True)
class Ranks:
    """Where the ranks run: ``count`` of them on this machine (loopback, ring), or the hosts of an
    mlx.launch host file."""

    count: int | None = None
    hostfile: Path | None = None
    backend: str = "ring"
    pipeline: bool = False  # --pipeline: layers split across ranks instead of heads

    @property
    def size(self) -> int:
        return self.count if self.count is not None else len(hosts_of(self.hostfile))


def hosts_of(hostfile: Path | None) -> list[dict]:
    """The hosts of an mlx.launch host file (a list, or ``{"hosts": [...]}``), checked: each needs
    an ``ssh`` name, and ``ips`` for the ring backend."""
    if hostfile is None:
        return []
    data = read_json_setting(hostfile, "--hostfile")
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list) or not hosts:
        raise UsageError(f"--hostfile {hostfile}: expected a list of hosts, e.g. "
                         '[{"ssh": "mac1.local", "ips": ["192.168.1.10"]}, {"ssh": "mac2.local", "ips": [...]}]')
    if len(hosts) > MAX_RANKS:
        raise UsageError(f"--hostfile {hostfile}: {len(hosts)} hosts, over the {MAX_RANKS} ranks localchat launches")
    for i, host in enumerate(hosts):
        if not isinstance(host, dict) or not isinstance(host.get("ssh"), str) or not host["ssh"]:
            raise UsageError(f"--hostfile {hostfile}: host {i} needs an \"ssh\" name")
        ips = host.get("ips", [])
        if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
            raise UsageError(f"--hostfile {hostfile}: host {i}'s \"ips\" must be a list of addresses")
    return hosts


def check_ranks(ranks: Ranks, model_dir: Path | None) -> None:
    """Usage errors before anything starts: the count, the backend, the host file, and whether the
    model (when its config is on this machine) splits evenly across the ranks."""
    if ranks.backend not in BACKENDS:
        raise UsageError(f"--distributed-backend must be one of {', '.join(BACKENDS)}, not {ranks.backend!r}")
    if ranks.count is not None and ranks.hostfile is not None:
        raise UsageError("--ranks (this machine) and --hostfile (several) are alternatives")
    if ranks.count is not None and not 1 <= ranks.count <= MAX_RANKS:
        raise UsageError(f"--ranks must be from 1 to {MAX_RANKS}, not {ranks.count}")
    if ranks.count is not None and ranks.backend != "ring":
        raise UsageError(f"--ranks runs every rank on this machine over the ring backend; {ranks.backend} needs "
                         "--hostfile")
    hosts = hosts_of(ranks.hostfile)
    if ranks.backend == "ring" and any(not h.get("ips") for h in hosts):
        raise UsageError(f"--hostfile {ranks.hostfile}: the ring backend needs \"ips\" for every host")
    if model_dir is not None:
        check_split(read_config(model_dir), ranks)


def check_split(config: dict, ranks: Ranks) -> None:
    """Tensor parallelism splits every layer's heads across the ranks; pipelining splits the layers.
    Which of the two mlx_lm can do depends on the architecture (llama: heads only)."""
    n = ranks.size
    found = config.get("text_config")
    text: dict = found if isinstance(found, dict) else config
    heads, kv_heads = (
        text.get("num_attention_heads"),
        text.get("num_key_value_heads") or text.get("num_attention_heads"),
    )
    layers = text.get("num_hidden_layers")
    splits = what_mlx_lm_splits(config)  # the top-level model_type: what mlx_lm loads
    if ranks.pipeline:
        if splits and not splits.by_layers:
            raise UsageError(f"--pipeline: mlx_lm {splits.version} cannot split {splits.kind} models by layers; "
                             "leave it out and the heads are split")
        if isinstance(layers, int) and layers < n:
            raise UsageError(f"--pipeline splits the model's {layers} layers across the ranks: at most {layers} ranks")
        return
    if splits and not splits.by_heads:
        raise UsageError(f"mlx_lm {splits.version} cannot split {splits.kind} models by heads; "
                         + ("add --pipeline (layers split across the ranks)" if splits.by_layers else
                            "nor by layers: serve it on one machine"))
    if not isinstance(heads, int) or not isinstance(kv_heads, int):
        return
    width = text.get("intermediate_size")  # (the feed-forward layers are split across the ranks too)
    width = width if isinstance(width, int) and width > 0 else n
    if heads % n == 0 and kv_heads % n == 0 and width % n == 0:
        return
    fits = [k for k in range(2, min(heads, MAX_RANKS) + 1) if heads % k == 0 and kv_heads % k == 0 and width % k == 0]
    hint = f"use --ranks {fits[0]}" if fits else "this model cannot be split by heads"
    if splits is None or splits.by_layers:
        hint += ", or --pipeline (layers split across the ranks)"
    else:
        hint += (
            f" (--pipeline, which splits layers instead, is not in mlx_lm {splits.version} for {splits.kind} models)"
        )
    shared = f"{heads} attention heads ({kv_heads} key/value heads)" + (
        f" and a feed-forward width of {width}" if width % n else "")
    raise UsageError(f"the model has {shared}: {n} ranks cannot share them evenly; {hint}")


@dataclass(frozen=True)
class Splits:
    """What mlx_lm can shard for one architecture: heads (its ``Model.shard``), layers (``PipelineMixin``)."""

    kind: str
    by_heads: bool
    by_layers: bool
    version: str


def what_mlx_lm_splits(config: dict) -> Splits | None:
    """Read from the installed mlx_lm's own model module, as its ``sharded_load`` decides; None when
    the architecture is unknown here (then the launch itself says)."""
    kind = config.get("model_type")
    if not isinstance(kind, str) or not re.fullmatch(r"[a-z0-9_]+", kind.replace("-", "_")):
        return None
    try:
        import mlx_lm
        from mlx_lm.models.pipeline import PipelineMixin
        from mlx_lm.utils import MODEL_REMAPPING

        module = importlib.import_module(f"mlx_lm.models.{MODEL_REMAPPING.get(kind, kind).replace('-', '_')}")
    except ImportError:
        return None
    own = [c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__]
    return Splits(kind=kind, by_heads=hasattr(getattr(module, "Model", None), "shard"),
                  by_layers=any(issubclass(c, PipelineMixin) for c in own), version=mlx_lm.__version__)


def launcher() -> list[str]:
    """``mlx.launch`` beside this Python (a venv, ``uv tool install``), else its module."""
    script = Path(sys.executable).with_name("mlx.launch")
    if script.is_file():
        return [str(script)]
    found = shutil.which("mlx.launch")
    return [found] if found else [sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()"]


def ring_ports(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports, for the ring between local ranks
    (mlx.launch's default block could be taken by another job)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count < 65536 and all(_free(port) for port in range(first, first + count)):
            return first
    raise UsageError(f"no block of {count} free ports for the ranks on this machine")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def launch_command(ranks: Ranks, server: list[str]) -> list[str]:
    """mlx.launch running ``server`` (the mlx_lm.server command line, ``python -m mlx_lm …``) on
    every rank; a local rank runs inside the rank guard, which ends it when ``serve`` is gone."""
    if ranks.hostfile is not None:  # remote ranks end with their ssh session (SIGHUP)
        where = ["--hostfile", str(ranks.hostfile)]
    else:
        where = ["--hosts", "127.0.0.1", "-n", str(ranks.count), "--starting-port", str(ring_ports(ranks.count or 1))]
        python, flag, *rest = server
        server = [python, flag, "localchat.serve.engine.rank_guard", *rest] if flag == "-m" else server
    extra = ["--pipeline"] if ranks.pipeline and "--pipeline" not in server else []
    return [*launcher(), "--backend", ranks.backend, *where, "--", *server, *extra]


def exit_words(code: int) -> str:
    """``exited with code 1``, or ``was killed by SIGKILL`` for a negative code (a signal)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def failed_rank(log_text: str) -> str | None:
    """``rank 1 was killed by SIGKILL`` from the launcher's own words in the log, if a rank failed."""
    match = RANK_FAILED.search(log_text)
    if match is None:
        return None
    if match[2] is None:
        return f"rank {match[1]} {'was killed' if match[3] == 'was killed' else 'failed'}"
    unreachable = " (ssh could not reach its host: check the host file's names, and that `ssh HOST` works without " \
                  "a password)" if match[2] == "255" else ""
    return f"rank {match[1]} {exit_words(int(match[2]))}{unreachable}"
