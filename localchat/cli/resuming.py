"""Which conversation a chat continues, and what resuming it says.

``--resume NAME`` (a name from ``/save``, or an id from ``localchat log``), ``--continue`` (the
latest conversation), or ``--resume`` alone: on a terminal the recent conversations are listed to
pick from (first question, model, turns, age); elsewhere the list and what to type instead.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from localchat.cli.options import ChatOptions
from localchat.cli.render import ChatUI
from localchat.conversation.turn import ChatSession
from localchat.errors import UsageError
from localchat.store.saved_sessions import SavedSession, SessionNotFound, default_store
from localchat.store.session_cache import SessionCaches, restore_cache
from localchat.wording import ago, count, run_as

if TYPE_CHECKING:
    from localchat.tools.runner import ToolRunner

PICK_FROM = 10


def resumed(opts: ChatOptions, ui: ChatUI) -> SavedSession | None:
    """The conversation to continue; its system message and settings come with it."""
    storage = opts.storage
    if storage.resume is None and not storage.continue_latest:
        return None
    if storage.resume is not None and storage.continue_latest:
        raise UsageError("--resume and --continue are alternatives: --continue takes the latest conversation")
    if opts.generation.system is not None:
        raise UsageError(f"{'--continue' if storage.continue_latest else '--resume'} restores the conversation's "
                         "system message: leave out --system")
    store = default_store()
    if storage.continue_latest:
        latest = store.latest()
        if latest is None:
            raise SessionNotFound("no conversation to continue yet: start one with `localchat chat`")
        return latest
    return store.load(storage.resume) if storage.resume else pick(ui)


def pick(ui: ChatUI) -> SavedSession:
    """One of the recent conversations, chosen by its number on a terminal."""
    from localchat.store.conversation_log import recent

    store = default_store()
    if not store.path.exists():
        raise SessionNotFound("no conversation to resume yet: start one with `localchat chat`")
    with store.connect() as conn:
        choices = recent(conn, limit=PICK_FROM)
    if not choices:
        raise SessionNotFound("no conversation to resume yet: start one with `localchat chat`")
    for number, c in enumerate(choices, 1):
        first = " ".join(c.first.split())
        ui.info(f"{number:>3}. {first[:60] + ('…' if len(first) > 60 else '')} · {c.model or 'the server’s model'} · "
                f"{count(c.turns, 'turn')} · {ago(c.updated)} · {c.name or c.uid}")
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise UsageError(f"--resume needs a name or an id here (no terminal to pick on): {run_as()} chat --resume ID, "
                         "or --continue for the latest")
    while True:
        try:
            answer = input(f"continue which (1-{len(choices)}, Enter for none)? ").strip()
        except EOFError:
            answer = ""
        if not answer:
            raise UsageError(f"nothing was chosen: {run_as()} chat --resume ID, or --continue for the latest")
        if answer.isdigit() and 1 <= int(answer) <= len(choices):
            chosen = choices[int(answer) - 1]
            return store.load(chosen.name or chosen.uid)
        ui.notice(f"give a number from 1 to {len(choices)}")


def shown(saved: SavedSession) -> str:
    return saved.name or saved.uid


def resumed_line(saved: SavedSession, session: ChatSession, caches: SessionCaches) -> str:
    """What was resumed, and whether its saved KV cache spares the first turn's prefill."""
    notes = f", {len(saved.pins)} pin(s)" + (", notes of earlier turns" if saved.summary else "")
    cache = restore_cache(session, saved.uid, saved.name or f"chat-{saved.uid}", caches.files)
    return f"resumed '{shown(saved)}': {len(saved.turns)} turn(s){notes}" + (f"; {cache}" if cache else "")


def resumed_tools_line(saved: SavedSession, tools: ToolRunner | None) -> str | None:
    """A session whose turns called tools, said so once: which it used, which are offered now."""
    used = sorted({call["name"] for turn in saved.turns for step in turn.steps for call in step.calls})
    if not used:
        return None
    offered = tools.names() if tools else []
    missing = [name for name in used if name not in offered]
    now = f"offered now: {', '.join(offered)}" if offered else "no tools are offered now"
    hint = f" ({', '.join(missing)} not offered: resume with --tools FILE.py to offer them again)" if missing else ""
    return f"'{shown(saved)}' was saved with tool calls to {', '.join(used)}; {now}{hint}"
