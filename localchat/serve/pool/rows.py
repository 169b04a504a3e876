"""A held model as ``/localchat/ps`` (and ``/metrics``) report it: the pool's own figures, and what
its engine says of its KV caches and its latest prompt cache break."""

from __future__ import annotations

from typing import Any

from localchat.serve.pool.served import LOADED, ServedModel


def held_row(model: ServedModel, now: float) -> dict[str, Any]:
    expires = None
    if model.keep_alive is not None and not model.pinned and model.state == LOADED:
        expires = model.keep_alive if model.in_flight else max(0.0, model.keep_alive - (now - model.last_used))
    pid = model.server.process.pid if model.server is not None else None
    return {"model": model.key, "state": model.state, "memory_bytes": model.estimate, "expires_in_s": expires,
            "in_flight": model.in_flight, "waiting": model.waiting, "pid": pid, "pinned": model.pinned,
            "kv_bits": model.kv.bits,
            "loaded_at": model.loaded_at,
            "log": str(model.server.log_path) if model.server is not None else None,
            "engine_url": model.server.base_url if model.server is not None else None}


def engine_kv(engine_url: str | None) -> dict[str, Any]:
    """What an engine says of its KV caches (``GET /localchat/kv``): the bytes they hold now, and its
    latest prompt cache break; nothing from one that does not say (``--plain``, a picture model's)
    or does not answer at once."""
    import httpx

    from localchat.backends.http import shared_ssl_context

    if engine_url is None:
        return {}
    try:
        said = httpx.get(engine_url.removesuffix("/v1") + "/localchat/kv", timeout=2.0,
                         verify=shared_ssl_context()).json()
    except (httpx.HTTPError, ValueError):
        return {}
    if not isinstance(said, dict):
        return {}
    held, broke = said.get("bytes"), said.get("last_break")
    return {"kv_bytes": held if type(held) is int and held >= 0 else None,
            "last_break": broke if isinstance(broke, dict) else None}
