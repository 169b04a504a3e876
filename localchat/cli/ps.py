"""``localchat ps``: the models a running ``serve`` holds, as its front reports them
(``GET /localchat/ps``), found by ``--base-url`` as ``smoke`` finds a server.

What answers there is read as untrusted input: its size and depth bounded, each row typed
(``HeldModel``), at most ``MAX_ROWS`` of them; anything that is not what ``serve`` sends is one line.
A table shows each name whole on its line; where the terminal is too narrow for that, each model is a
block (its name folded only when it is wider than the terminal itself).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from rich.box import SIMPLE_HEAD
from rich.console import Console
from rich.table import Column, Table

from localchat import bounded_json
from localchat.backends.http import shared_ssl_context
from localchat.errors import LocalchatError
from localchat.safe_text import visible
from localchat.sizes import shown_size

PS_PATH = "/localchat/ps"
MAX_BYTES = 4 * 1024**2  # far past what any serve's models make
MAX_ROWS = 1000
OTHER_COLUMNS = 104  # what the table's columns but the name take: narrower, a block a model (no name is cut)
EPOCH_MAX = 10**11  # seconds since 1970: a later "loaded at" is not a time


@dataclass(frozen=True)
class HeldModel:
    """One row of ``/localchat/ps``, typed."""

    model: str
    state: str
    memory_bytes: int | None
    resident_bytes: int | None
    loaded_at: float | None
    expires_in_s: float | None
    in_flight: int
    waiting: int
    pid: int | None
    pinned: bool
    kv_bytes: int | None = None  # what its KV caches hold now (the batch's and the prompt cache's)
    kv_bits: int | None = None  # None: not quantized (the model's own float)
    last_break: str | None = None  # where its latest prompt broke from its cache, said short


def fetch_held(base_url: str, api_key: str | None = None) -> dict[str, Any]:
    """What the front at ``base_url`` reports; one line when nothing answers or it is not a serve."""
    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.stream("GET", root + PS_PATH, headers=headers, timeout=10.0,
                          verify=shared_ssl_context()) as response:
            body = _bounded(response, root)
    except httpx.HTTPError as exc:
        raise LocalchatError(f"nothing answers at {root} ({type(exc).__name__}): start one with localchat serve, "
                             "or name its port with --base-url") from None
    if response.status_code == 401:
        raise LocalchatError(f"{root} wants a key: pass the serve's --api-key with --api-key")
    try:
        held = bounded_json.loads(body)
    except ValueError:
        held = None
    if response.status_code != 200 or not isinstance(held, dict) or not isinstance(held.get("models"), list):
        raise LocalchatError(f"{root} is not a localchat serve that reports its models (HTTP "
                             f"{response.status_code} on {PS_PATH})")
    return held


def _bounded(response: httpx.Response, root: str) -> bytes:
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_BYTES:
            raise LocalchatError(f"{root} answers {PS_PATH} with more than {MAX_BYTES:,} bytes: not a localchat serve")
        chunks.append(chunk)
    return b"".join(chunks)


def held_models(held: dict[str, Any], root: str) -> list[HeldModel]:
    """The rows, typed; one line naming the first that is not what ``serve`` sends."""
    rows = held["models"]
    if len(rows) > MAX_ROWS:
        raise LocalchatError(f"{root} reports {len(rows):,} models, more than any serve holds ({MAX_ROWS:,})")
    return [_typed(row, number, root) for number, row in enumerate(rows)]


def _typed(row: Any, number: int, root: str) -> HeldModel:
    def wrong(field: str) -> LocalchatError:
        return LocalchatError(f"{root} is not a localchat serve: model {number}'s {field} is not what serve sends")

    if not isinstance(row, dict):
        raise wrong("row")
    values: dict[str, Any] = {}
    for field, kind in (("model", str), ("state", str)):
        if not isinstance(row.get(field), kind) or not row[field] or len(row[field]) > 1000:
            raise wrong(field)
        values[field] = row[field]
    for field in ("memory_bytes", "resident_bytes", "pid", "kv_bytes"):
        value = row.get(field)
        if value is not None and (type(value) is not int or not 0 <= value < 2**63):
            raise wrong(field)
        values[field] = value
    for field in ("in_flight", "waiting"):
        value = row.get(field, 0)
        if type(value) is not int or not 0 <= value < 2**31:
            raise wrong(field)
        values[field] = value
    for field, top in (("loaded_at", EPOCH_MAX), ("expires_in_s", EPOCH_MAX)):
        value = row.get(field)
        if value is not None and (type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value < top):
            raise wrong(field)
        values[field] = value
    if type(row.get("pinned", False)) is not bool:
        raise wrong("pinned")
    bits = row.get("kv_bits")
    if bits is not None and (type(bits) is not int or not 1 <= bits <= 16):
        raise wrong("kv_bits")
    values["kv_bits"] = bits
    values["last_break"] = _break(row.get("last_break"))
    return HeldModel(pinned=row.get("pinned", False), **values)


def run_ps(*, base_url: str, api_key: str | None, as_json: bool, console: Console) -> int:
    held = fetch_held(base_url, api_key)
    rows = held_models(held, base_url.rstrip("/").removesuffix("/v1"))
    if as_json:
        console.print(json.dumps([asdict(row) for row in rows], allow_nan=False), markup=False, soft_wrap=True)
        return 0
    served = held.get("served")
    if not rows:
        names = ", ".join(str(s) for s in served[:50]) if isinstance(served, list) else "?"
        console.print(f"no model loaded (serving {names})", markup=False, overflow="fold", soft_wrap=False)
    elif console.width < max(len(row.model) for row in rows) + OTHER_COLUMNS:
        show_blocks(console, rows)
    else:
        show_table(console, rows)
    for row in rows:
        if row.last_break:
            console.print(f"{row.model}: the last prompt broke from its cache at {row.last_break}", style="dim",
                          markup=False, overflow="fold")
    _show_upstreams(console, held.get("upstreams"))
    _show_budget(console, rows, held)
    _show_disk(console, held.get("prompt_cache"))
    return 0


def _show_upstreams(console: Console, upstreams: Any) -> None:
    """The models served by another server (``--upstream``, ``gateway --upstream``, a ``--ranks``
    group): never loaded or unloaded by this one, so in no row above."""
    if not isinstance(upstreams, dict):
        return
    for name, url in list(upstreams.items())[:50]:
        if isinstance(url, str):
            console.print(f"{name[:500]}: served by {url[:500]} (not loaded or unloaded here)", style="dim",
                          markup=False, overflow="fold", soft_wrap=False)


def show_table(console: Console, rows: list[HeldModel]) -> None:
    table = Table(Column("model", no_wrap=True), "state", "estimate", "resident", "KV cache", "since", "expires",
                  "requests", "pid", box=SIMPLE_HEAD)
    for row in rows:
        table.add_row(row.model, row.state, shown_size(row.memory_bytes), shown_size(row.resident_bytes), _kv(row),
                      _since(row.loaded_at), _expires(row), _requests(row), str(row.pid or "-"))
    console.print(table, markup=False)


def show_blocks(console: Console, rows: list[HeldModel]) -> None:
    """A model a block: its name on a line of its own (folded, never cut), then its figures in
    lines short enough for any terminal."""
    for row in rows:
        console.print(row.model, markup=False, style="bold", overflow="fold", soft_wrap=False)
        for line in (f"{row.state} · estimate {shown_size(row.memory_bytes)}",
                     f"resident {shown_size(row.resident_bytes)} · KV cache {_kv(row)}",
                     f"since {_since(row.loaded_at)}",
                     f"expires {_expires(row)} · requests {_requests(row)} · pid {row.pid or '-'}"):
            console.print(f"  {line}", markup=False, overflow="fold", soft_wrap=False)


def _show_budget(console: Console, rows: list[HeldModel], held: dict[str, Any]) -> None:
    budget = held.get("budget_bytes")
    if rows and type(budget) is int and budget >= 0:
        total = sum(r.memory_bytes or 0 for r in rows)
        source = held.get("budget_source")
        console.print(f"{shown_size(total)} estimated of {shown_size(budget)}"
                      f"{f' ({source[:200]})' if isinstance(source, str) else ''}", style="dim", markup=False)


def _show_disk(console: Console, disk: Any) -> None:
    if not isinstance(disk, dict) or type(disk.get("bytes")) is not int or type(disk.get("max_bytes")) is not int:
        return
    hits = disk.get("hits") if type(disk.get("hits")) is int else "?"
    where = str(disk["dir"]) if isinstance(disk.get("dir"), str) else "?"
    console.print(f"prompt caches on disk: {shown_size(disk['bytes'])} of {shown_size(disk['max_bytes'])}, {hits} "
                  f"served from disk ({where[:500]})", style="dim", markup=False)


def _since(value: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(value)) if value is not None else "-"


def _expires(row: HeldModel) -> str:
    if row.pinned:
        return "pinned"
    if row.state == "loading":
        return "-"
    return "never" if row.expires_in_s is None else f"{row.expires_in_s:.0f}s"


def _requests(row: HeldModel) -> str:
    return f"{row.in_flight} (+{row.waiting} waiting)" if row.waiting else str(row.in_flight)


def _kv(row: HeldModel) -> str:
    bits = f"{row.kv_bits}-bit" if row.kv_bits else "full"  # (the model's float: 16 bits, or 32)
    return f"{shown_size(row.kv_bytes)} ({bits})" if row.kv_bytes is not None else bits


def _break(said: Any) -> str | None:
    """An engine's latest cache break (``{"at", "message", "role", "when"}``), said short; None when
    there is none or it is not what serve sends."""
    if not isinstance(said, dict) or type(said.get("at")) is not int or said["at"] < 0:
        return None
    when = said.get("when")
    ago = f", {max(0.0, time.time() - when):.0f}s ago" if isinstance(when, (int, float)) and math.isfinite(when) else ""
    message, role = said.get("message"), said.get("role")
    where = f", in message {message} ({visible(role[:20])})" if type(message) is int and isinstance(role, str) else ""
    return f"token {said['at']:,}{where}{ago}"
