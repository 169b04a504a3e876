"""``localchat ps``: the models a running ``serve`` holds, as its front reports them
(``GET /localchat/ps``), found by ``--base-url`` as ``smoke`` finds a server."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from rich.box import SIMPLE_HEAD
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from localchat.errors import LocalchatError
from localchat.sizes import shown_size

PS_PATH = "/localchat/ps"


def fetch_held(base_url: str, api_key: str | None = None) -> dict[str, Any]:
    """What the front at ``base_url`` holds; one line when nothing answers or it is not a serve."""
    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(root + PS_PATH, headers=headers, timeout=10.0)
    except httpx.HTTPError as exc:
        raise LocalchatError(f"nothing answers at {root} ({type(exc).__name__}): start one with localchat serve, "
                             "or name its port with --base-url") from None
    if response.status_code == 401:
        raise LocalchatError(f"{root} wants a key: pass the serve's --api-key with --api-key")
    try:
        held = response.json()
    except ValueError:
        held = None
    if response.status_code != 200 or not isinstance(held, dict) or not isinstance(held.get("models"), list):
        raise LocalchatError(f"{root} is not a localchat serve that reports its models (HTTP "
                             f"{response.status_code} on {PS_PATH})")
    return held


def run_ps(*, base_url: str, api_key: str | None, as_json: bool, console: Console) -> int:
    held = fetch_held(base_url, api_key)
    rows = [row for row in held["models"] if isinstance(row, dict)]
    if as_json:
        console.print_json(json.dumps(rows))
        return 0
    if not rows:
        console.print(f"no model loaded (serving {', '.join(map(str, held.get('served', [])))})", markup=False)
    else:
        show_rows(console, rows, held)
    disk = held.get("prompt_cache")
    if isinstance(disk, dict) and isinstance(disk.get("bytes"), int) and isinstance(disk.get("max_bytes"), int):
        console.print(f"prompt caches on disk: {shown_size(disk['bytes'])} of {shown_size(disk['max_bytes'])}, "
                      f"{disk.get('hits')} "
                      f"served from disk ({disk.get('dir')})", style="dim", markup=False)
    return 0


def show_rows(console: Console, rows: list[dict[str, Any]], held: dict[str, Any]) -> None:
    table = Table("model", "state", "estimate", "resident", "since", "expires", "requests", "pid", box=SIMPLE_HEAD)
    for row in rows:
        table.add_row(escape(str(row.get("model"))), str(row.get("state")), shown_size(row.get("memory_bytes")),
                      shown_size(row.get("resident_bytes")), _since(row.get("loaded_at")),
                      _expires(row.get("expires_in_s"), row.get("pinned")), str(row.get("in_flight")),
                      str(row.get("pid") or "-"))
    console.print(table)
    if isinstance(held.get("budget_bytes"), int):
        total = sum(r.get("memory_bytes") or 0 for r in rows)
        console.print(f"{shown_size(total)} estimated of {shown_size(held['budget_bytes'])} "
                      f"({held.get('budget_source')})",
                      style="dim", markup=False)


def _since(value: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(value)) if isinstance(value, (int, float)) else "-"


def _expires(value: Any, pinned: Any) -> str:
    if pinned:
        return "pinned"
    if value is None:
        return "never"
    return f"{value:.0f}s" if isinstance(value, (int, float)) else "-"
