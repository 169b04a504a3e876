"""``localchat log``: every kept conversation, listed, searched, shown and removed."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from localchat.errors import UsageError
from localchat.store import conversation_log as log
from localchat.store.kv_files import cache_files
from localchat.store.saved_sessions import SessionNotFound, default_store
from localchat.wording import ago, count, run_as


def _store():
    store = default_store()
    if not store.path.exists():
        raise SessionNotFound(f"no conversations kept yet ({store.path} does not exist)")
    return store


def show_log(*, console: Console, query: str | None, model: str | None, since: str | None, as_json: bool,
             limit: int) -> None:
    """The recent conversations, or (``-q``) the turns that match, best first."""
    with _store().connect() as conn:
        if query is None:
            found: list[Any] = log.recent(conn, model=model, since=since, limit=limit)
        else:
            found = log.search(conn, query, model=model, since=since, limit=limit)
    if as_json:
        sys.stdout.write(json.dumps([_as_dict(item) for item in found], ensure_ascii=False, indent=2) + "\n")
        return
    if not found:
        console.print("nothing found" if query is not None else "no conversations kept yet", style="dim")
        return
    if query is None:
        table = Table()
        table.add_column("id", no_wrap=True, min_width=max(len(c.name or c.uid) for c in found))  # whole, any width
        for heading in ("first question", "model", "turns", "last"):
            table.add_column(heading)
        for c in found:
            first = " ".join(c.first.split())
            table.add_row(c.name or c.uid, first[:70] + ("…" if len(first) > 70 else ""), c.model or "-",
                          str(c.turns), ago(c.updated))
        console.print(table)
        console.print(f"continue one: {run_as()} chat --resume ID · see it: {run_as()} log show ID", style="dim")
        return
    for hit in found:
        console.print(f"[bold]{escape(hit.uid)}[/bold] · {escape(hit.time)} · {escape(hit.model or '-')} · "
                      f"{hit.field}: {_marked(hit.line, console.is_terminal)}", highlight=False)


def _marked(line: str, terminal: bool) -> str:
    """A hit's line as Rich markup, its terms bold on a terminal, in ** elsewhere."""
    text = escape(line)
    opening, closing = ("[bold yellow]", "[/bold yellow]") if terminal else ("**", "**")
    return text.replace(log.MARK_OPEN, opening).replace(log.MARK_CLOSE, closing)


def _as_dict(item: Any) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(item)
    if "line" in data:
        data["line"] = data["line"].replace(log.MARK_OPEN, "").replace(log.MARK_CLOSE, "")
    return data


def show_entry(*, console: Console, key: str) -> None:
    """One conversation's every logged turn, in order, with its figures."""
    from localchat.cli.render import shortened
    from localchat.conversation.stats import stats_from_dict, stats_line
    from localchat.store.tool_steps import tool_steps

    with _store().connect() as conn:
        uid = log.conversation_of(conn, key)
        rows = log.entries(conn, uid) if uid else []
    if not rows:
        raise SessionNotFound(f"no conversation {key!r} in the log (see: localchat log)")
    from rich.padding import Padding
    from rich.text import Text

    def indented(markup: str, style: str = "") -> None:  # wrapped lines keep the indentation
        console.print(Padding(Text.from_markup(markup, style=style), (0, 0, 0, 5)))

    console.print(f"[bold]{escape(uid or key)}[/bold] · {count(len(rows), 'turn')} kept")
    for number, (when, model, user, assistant, reasoning, steps, stats, taken_back, images) in enumerate(rows, 1):
        back = " (taken back)" if taken_back else ""
        console.print(f"{number:>3}. {escape(when)} · {escape(model or '-')}{back}", style="dim")
        for label in picture_labels(images):
            indented(f"[cyan]user[/cyan]: {escape(label)}")
        indented(f"[cyan]user[/cyan]: {escape(user)}")
        for step in _steps(steps, tool_steps):
            for call, result in zip(step.calls, step.results):
                indented(f"[cyan]tool[/cyan]: {escape(call['name'])}({escape(shortened(call['arguments']))})"
                         f" → {escape(shortened(result))}")
        if reasoning:
            indented(f"[cyan]reasoning[/cyan]: {escape(reasoning)}", style="dim")
        indented(f"[cyan]assistant[/cyan]: {escape(assistant)}")
        figures = stats_from_dict(_json(stats))
        if figures:
            indented(escape(stats_line(figures)), style="dim")


def _json(text: str | None) -> Any:
    from localchat import bounded_json

    try:
        return bounded_json.loads(text) if text else None
    except ValueError:
        return None


def picture_labels(text: str | None) -> list[str]:
    """A logged turn's pictures as their labels; a damaged list shows as one ``[image]``."""
    from localchat.vision.image import ImageRef

    refs = _json(text)
    if text and not isinstance(refs, list):
        return ["[image]"]
    labels = []
    for raw in refs or []:
        try:
            labels.append(ImageRef.from_dict(raw).label())
        except (KeyError, TypeError, ValueError):
            labels.append("[image]")
    return labels


def _steps(text: str | None, read: Any) -> tuple:
    try:
        return read(_json(text)) if text else ()
    except (TypeError, ValueError):
        return ()


def remove_entries(*, console: Console, key: str | None, older_than: str | None, everything: bool,
                   yes: bool = False) -> None:
    """Conversations out of the log (and their state and KV caches): one, the old ones, or all;
    many at once only when the user says so (asked on a terminal, ``--yes`` elsewhere)."""
    if sum(x is not None and x is not False for x in (key, older_than, everything or None)) != 1:
        raise UsageError("log rm takes one of: an ID, --older-than AGE (e.g. 30d), --all")
    files = cache_files()
    if everything:
        _prompt_cache_files().check_root()  # (a linked prompt-cache/ is refused before anything goes)
    if key is None and not yes:
        _confirm_bulk(console, older_than)
    if everything and not default_store().path.exists():
        freed = remove_prompt_caches()
        console.print(f"no conversations kept yet; serve's prompt caches on disk removed ({freed / 1e6:.1f} MB)")
        return
    with _store().connect(write=True) as conn:
        if key is not None:
            uid = log.conversation_of(conn, key)
            if uid is None:
                raise SessionNotFound(f"no conversation {key!r} in the log (see: localchat log)")
            uids = [uid]
        elif older_than is not None:
            uids = log.older_than(conn, older_than)
        else:
            uids = [row[0] for row in conn.execute("SELECT uid FROM sessions UNION SELECT uid FROM log").fetchall()]
        names = dict(conn.execute("SELECT uid, name FROM sessions WHERE name IS NOT NULL").fetchall())
        turns = log.remove(conn, uids)
    leftovers = [n for n in files.names() if n.startswith("chat-")] if everything else []  # no owner is left
    for uid in uids:
        for cache in (names.get(uid), f"chat-{uid}", *leftovers):
            if cache:
                try:
                    files.remove(cache)
                except Exception:  # noqa: BLE001 - a cache that cannot go is only a prefix cache
                    pass
    freed = remove_prompt_caches() if everything else 0
    also = f"; serve's prompt caches on disk too ({freed / 1e6:.1f} MB)" if freed else ""
    console.print(f"removed {count(len(uids), 'conversation')} ({count(turns, 'logged turn')}){also}")


def _prompt_cache_files():
    from localchat.store.prompt_files import PromptFiles, default_root

    return PromptFiles(default_root())


def remove_prompt_caches() -> int:
    """``log rm --all`` forgets what serve kept of conversations too: its prompt caches on disk."""
    return _prompt_cache_files().remove_all()


def _confirm_bulk(console: Console, older_than: str | None) -> None:
    """Removing many conversations at once is asked first on a terminal; elsewhere it needs ``--yes``."""
    what = f"every conversation last kept more than {older_than} ago" if older_than else "every conversation"
    if not sys.stdin.isatty():
        raise UsageError(f"log rm would remove {what}: add --yes (there is no terminal to ask on)")
    answer = console.input(f"remove {what} from the log, with their KV caches? [y/N] ", markup=False)
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("nothing removed")
