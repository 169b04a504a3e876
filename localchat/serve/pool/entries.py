"""What ``serve`` hands the router: the models named on its command line (each found on this
machine and estimated before anything loads), the models served elsewhere, and how an engine
child is started for one of them."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx

from localchat.errors import LocalchatError, UsageError
from localchat.fit.check import FitSettings, judge_shape
from localchat.fit.estimate import KVSettings
from localchat.fit.shape import local_shape
from localchat.processes import SERVED_ID
from localchat.registry import ModelRef, load_registry, local_dir, resolve
from localchat.serve.kv_options import NO_KV_CHOICE, KVChoice, engine_args
from localchat.serve.pool.pool import Launcher, ModelPool
from localchat.serve.pool.served import ServedModel, names_of
from localchat.serve.pool.upstream import SERVER_DEFAULT_MODEL, Upstream, reach_upstream
from localchat.server.launch import RunningServer, free_port, start_ready

UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
ENGINE_TIMEOUT_S = 3600.0  # our own child queues requests (mlx_lm.server with --kv-bits answers one at a time,
# a long prefill takes minutes on a CPU): waiting in its queue is not a stall, as a remote server's silence is


def present_models() -> list[str]:
    """``--all``: every model ``localchat models`` shows as present."""
    from localchat.registry import describe

    return [info.entry.id for info in map(describe, load_registry()) if info.present and not info.entry.vision]


def local_model(name: str, fit: FitSettings, pinned: bool, kv: KVChoice = NO_KV_CHOICE) -> ServedModel:
    """A model of this machine, estimated at the context it serves with the KV cache it will have
    (one line when it is not here, or when its KV settings cannot apply to it)."""
    ref = resolve(name)
    shape = local_shape(local_dir(ref))
    settings = kv.settings_for(names_of(ref), shape, ref.id)
    estimate = judge_shape(shape, replace(fit, kv=settings)).estimate.total
    return ServedModel(key=ref.id, names=names_of(ref), ref=ref, estimate=estimate, pinned=pinned, kv=settings)


def kv_settings_of(ref: ModelRef, choice: KVChoice) -> KVSettings:
    """``ref``'s KV settings for ``--ranks`` and ``--dry-run``, its shape read from this machine
    (only when bits are asked)."""
    if choice.bits_for(names_of(ref)) is None:
        return KVSettings()
    return choice.settings_for(names_of(ref), local_shape(local_dir(ref)), ref.id)


def served_models(names: list[str], pins: list[str], upstreams: list[str], fit: FitSettings,
                  kv: KVChoice = NO_KV_CHOICE) -> list[ServedModel]:
    """The models in the order given (the first is loaded at start), each once; then the remote ones."""
    models: list[ServedModel] = []
    for name in names:
        model = local_model(name, fit, pinned=False, kv=kv)
        if all(model.key != m.key for m in models):
            models.append(model)
    for pin in pins:
        found = next((m for m in models if pin in m.names or pin == m.key), None)
        if found is None:
            raise UsageError(f"--pin {pin}: not one of the models served ({', '.join(m.key for m in models)})")
        found.pinned = True
    for text in upstreams:  # (each name once: a second --upstream of a name is refused)
        models.append(remote_model(text, taken={n for m in models for n in m.names}))
    return models


def remote_model(text: str, taken: set[str]) -> ServedModel:
    """``--upstream NAME=URL``: a model served elsewhere, routed here by NAME, never loaded by us."""
    name, sep, url = text.partition("=")
    name, url = name.strip(), url.strip()
    if not sep or not name or not url.startswith(("http://", "https://")):
        raise UsageError(f"--upstream {text!r}: write NAME=URL, e.g. big=http://192.168.1.20:8080/v1")
    if name in taken:
        raise UsageError(f"--upstream {name}: that name is already served here")
    try:
        port = httpx.URL(url).port  # (parsed whole: an unclosed bracket is refused here)
    except (httpx.InvalidURL, ValueError) as exc:
        raise UsageError(f"--upstream {text!r}: {url!r} is not a URL ({exc})") from None
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"--upstream {text!r}: port {port} is not a port (1 to 65535)")
    base = url.rstrip("/")
    upstream = reach_upstream(base if base.endswith("/v1") else base + "/v1", None)
    upstream.model_id = name
    return ServedModel(key=name, names=frozenset({name}), remote=upstream)


def upstream_pool(upstream: Upstream, log: Callable[[str], None] = lambda _: None) -> ModelPool:
    """A pool of one server that is not ours to load or unload: ``gateway --upstream URL``, a
    ``--ranks`` group behind the front, ``load --launch --api``. Any name reaches it; its model is
    listed by the id it was given (``-m``), else by the ids that server lists (never a path)."""
    named = upstream.model_id if upstream.named else None
    listed = (named,) if named else tuple(sorted(n for n in upstream.served if not n.startswith("/"))) or \
        (SERVER_DEFAULT_MODEL,)
    model = ServedModel(key=listed[0], names=frozenset({*listed, upstream.model_id, *upstream.served}),
                        remote=upstream, listed=listed)
    return ModelPool([model], launcher=_never, log=log)


def _never(model: ServedModel) -> tuple[RunningServer, Upstream]:
    raise LocalchatError(f"{model.key} is served elsewhere: it is never loaded here")


def engine_launcher(first: str, port: int, first_log: Path, extra: tuple[str, ...], plain: bool,
                    tokenizers: bool, env: dict[str, str]) -> Launcher:
    """How the router starts one model's engine: our enforcing mlx_lm.server (mlx_vlm.server for a
    picture model) on a free loopback port, ready when a 1-token completion succeeds. Admission has
    judged its memory already, so its own fit check is not asked again. The front loads the model's
    tokenizer only for the gateway's APIs (``tokenizers``): chat completions are passed through."""

    def launch(model: ServedModel) -> tuple[RunningServer, Upstream]:
        assert model.ref is not None
        log = first_log if model.key == first else log_beside(first_log, port, model.key)
        server = start_ready(model.ref, port=free_port(), log=log, extra=(*extra, *engine_args(model.kv)),
                             fit=FitSettings(force=True),
                             plain=plain, env=env | {SERVED_ID: model.key},
                             append_log=model.key == first or model.loads > 0)
        try:
            return server, engine_upstream(server, model.ref, tokenizers)
        except (LocalchatError, OSError):
            server.stop()
            raise

    return launch


def engine_upstream(server: RunningServer, ref: ModelRef, tokenizer: bool) -> Upstream:
    """How the front reaches an engine child it started: our engine names the model by its id in
    its replies, so they are relayed as they come (a plain or picture engine's are renamed)."""
    upstream = reach_upstream(server.base_url, ref, tokenizer=tokenizer, timeout_s=ENGINE_TIMEOUT_S)
    upstream.writes_id = server.writes_id
    return upstream


def log_beside(first_log: Path, port: int, key: str) -> Path:
    """The log of a model other than the first: beside serve's own (``--log``)."""
    return first_log.with_name(f"server-{port}-{UNSAFE.sub('_', key)[:80]}.log")
