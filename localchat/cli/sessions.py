"""``localchat sessions list|show|rm|export``: the saved sessions, shown and managed."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from localchat import bounded_json
from localchat.cli.terminal import for_stream
from localchat.errors import LocalchatError
from localchat.sizes import shown_size
from localchat.store.kv_files import cache_files, read_metadata
from localchat.store.saved_sessions import default_store
from localchat.store.session_export import export_json, export_markdown


def show_list(console: Console) -> None:
    store, caches = default_store(), cache_files()
    summaries = store.list()
    if not summaries:
        console.print(f"no saved sessions in {store.path} (save one with /save NAME in the REPL)")
        return
    table = Table("name", "turns", "model", "backend", "saved", "KV cache")
    sizes = []
    for s in summaries:
        size = caches.size_of(s.name)
        sizes.append(size or 0)
        table.add_row(s.name, str(s.turns), s.model or "(server default)", s.backend, s.updated,
                      shown_size(size) if size is not None else "-")
    console.print(table)
    console.print(f"sessions in {store.path}; KV caches: {shown_size(sum(sizes))} of {shown_size(caches.max_bytes)} "
                  f"in {caches.directory}", style="dim", markup=False)


def cache_description(name: str) -> str:
    """A saved cache's size and what it holds, read from its header only."""
    try:
        path = cache_files().existing(name)
    except LocalchatError as exc:
        return f"KV cache: not usable ({exc}); a resume will not use it"
    if path is None:
        return "KV cache: none (saved without one, or evicted)"
    try:
        metadata = read_metadata(path)
        tokens = len(bounded_json.loads(metadata["ids"]))
        return f"KV cache: {shown_size(path.stat().st_size)}, {tokens} tokens of {metadata.get('model', '?')}"
    except (OSError, ValueError, KeyError) as exc:
        return f"KV cache: {shown_size(path.stat().st_size)}, damaged ({exc}); a resume will not use it"


def show_session(console: Console, name: str) -> None:
    from localchat.cli.render import shortened
    from localchat.conversation.stats import stats_line

    saved = default_store().load(name)
    console.print(f"[bold]{escape(saved.name or name)}[/bold] · model {escape(saved.model or '(server default)')} · "
                  f"{saved.backend} · saved {saved.updated}")
    console.print(cache_description(saved.name or name), style="dim", markup=False)
    if saved.system:
        console.print(f"[cyan]system[/cyan]: {escape(saved.system)}")
    for i, pin in enumerate(saved.pins, 1):
        console.print(f"[cyan]pin {i}[/cyan]: {escape(pin)}")
    if saved.summary:
        console.print(f"[cyan]notes of earlier turns[/cyan]: {escape(saved.summary)}")
    for i, turn in enumerate(saved.turns, 1):
        console.print(f"{i:>3}. [cyan]user[/cyan]: {escape(turn.user)}")
        for step in turn.steps:
            for call, result in zip(step.calls, step.results):
                console.print(f"     [cyan]tool[/cyan]: {escape(call['name'])}({escape(shortened(call['arguments']))})"
                              f" → {escape(shortened(result))}")
        if turn.reasoning:
            console.print(f"     [cyan]reasoning[/cyan]: {escape(turn.reasoning)}", style="dim")
        console.print(f"     [cyan]assistant[/cyan]: {escape(turn.assistant)}")
        if turn.stats:
            console.print("     " + stats_line(turn.stats), style="dim", markup=False)


def remove_session(console: Console, name: str) -> None:
    default_store().remove(name)
    try:
        size = cache_files().remove(name)
    except LocalchatError as exc:
        raise LocalchatError(f"removed {name!r}, but not its KV cache: {exc}") from None
    cache = f" and its KV cache ({shown_size(size)})" if size is not None else ""
    console.print(f"removed {escape(repr(name))}{cache}")


def export_session(name: str, fmt: str) -> None:
    saved = default_store().load(name)
    text = export_json(saved) if fmt == "json" else export_markdown(saved)
    sys.stdout.write(for_stream(sys.stdout)(text.rstrip("\n") + "\n"))  # exact through a pipe
