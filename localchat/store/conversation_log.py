"""The log of every accepted turn: appended when a turn is kept, listed, searched, shown, removed.

Search is SQLite's FTS5 over questions, answers and tool results (``log_search``), ranked by bm25,
the matching line shown with the query's terms marked. A query in FTS5's own syntax (``"harbor
17"``, ``harb*``, ``NEAR(a b)``, ``a OR b``) is passed as it is; one that FTS5 cannot parse is one
line. Text with Chinese (or Japanese) characters, which FTS5's word tokenizer does not split, is
found by substring instead. A turn taken back (``/undo``, or replaced by ``/retry``) stays in the
log, marked.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from localchat.conversation.history import Turn
from localchat.conversation.stats import stats_to_dict
from localchat.errors import UsageError
from localchat.store.pictures import drop_unreferenced, refs_json

MARK_OPEN, MARK_CLOSE = "\x02", "\x03"  # around a term in a snippet; the renderer styles them
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")
MAX_QUERY_CHARS = 10_000
SINCE = re.compile(r"^(\d{1,6})\s*([mhdw])$")
UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def tool_text(turn: Turn) -> str:
    """What a turn's tools said, as the search reads it: each call's name, arguments and result."""
    return "\n".join(f"{c['name']}({json.dumps(c['arguments'], ensure_ascii=False)}) → {r}"
                     for step in turn.steps for c, r in zip(step.calls, step.results))


def searched_question(turn: Turn) -> str:
    """The question as the search reads it: its pictures' labels (their file names), then its text."""
    return "\n".join([*(p.ref.label() for p in turn.images), turn.user])


def append_turns(conn: sqlite3.Connection, session: Any, turns: Sequence[Turn]) -> None:
    """Log ``turns`` of the conversation ``session`` (a ``SavedSession``), with their figures."""
    for turn in turns:
        row = conn.execute(
            "INSERT INTO log (uid, time, model, backend, user, assistant, reasoning, steps, stats, images) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (session.uid, time.strftime("%Y-%m-%d %H:%M:%S"), session.model, session.backend, turn.user,
             turn.assistant, turn.reasoning or None,
             json.dumps([_step(s) for s in turn.steps]) if turn.steps else None,
             json.dumps(stats_to_dict(turn.stats)) if turn.stats else None, refs_json(turn.images))).lastrowid
        conn.execute("INSERT INTO log_search (rowid, user, assistant, tools) VALUES (?, ?, ?, ?)",
                     (row, searched_question(turn), turn.assistant, tool_text(turn)))


def _step(step: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(step)


def mark_taken_back(conn: sqlite3.Connection, uid: str, count: int) -> None:
    """The conversation's last ``count`` logged turns that are not taken back yet, marked so."""
    if count > 0:
        conn.execute("UPDATE log SET taken_back = 1 WHERE id IN (SELECT id FROM log WHERE uid = ? AND taken_back = 0 "
                     "ORDER BY id DESC LIMIT ?)", (uid, count))


@dataclass(frozen=True)
class Conversation:
    """A line of ``localchat log``."""

    uid: str
    name: str | None
    first: str  # its first question
    model: str | None
    turns: int
    updated: str


@dataclass(frozen=True)
class Hit:
    """A logged turn that matched a search: where, and the line that matched, terms marked."""

    uid: str
    entry: int
    time: str
    model: str | None
    field: str  # user | assistant | tools
    line: str


def since_clause(since: str | None) -> tuple[str, list[Any]]:
    """``--since 2d`` (m, h, d, w) as a condition on a row's time."""
    if since is None:
        return "", []
    match = SINCE.match(since.strip())
    if not match:
        raise UsageError(f"--since {since!r}: give an age such as 30m, 12h, 2d or 3w")
    cutoff = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - int(match[1]) * UNIT_S[match[2]]))
    return "time >= ?", [cutoff]


def recent(conn: sqlite3.Connection, *, model: str | None = None, since: str | None = None,
           limit: int = 20) -> list[Conversation]:
    """Conversations with logged turns, the latest first."""
    where, args = _filters(model, since, "l.")
    rows = conn.execute(
        "SELECT l.uid, s.name, (SELECT user FROM log f WHERE f.uid = l.uid ORDER BY f.id LIMIT 1), "
        "MAX(l.model), SUM(l.taken_back = 0), MAX(l.time) FROM log l LEFT JOIN sessions s ON s.uid = l.uid "
        f"{where} GROUP BY l.uid ORDER BY MAX(l.id) DESC LIMIT ?", (*args, limit)).fetchall()
    return [Conversation(*row) for row in rows]


def _filters(model: str | None, since: str | None, prefix: str = "") -> tuple[str, list[Any]]:
    clauses, args = [], []
    if model:
        clauses.append(f"{prefix}model = ?")
        args.append(model)
    when, more = since_clause(since)
    if when:
        clauses.append(prefix + when)
        args += more
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", args


def search(conn: sqlite3.Connection, query: str, *, model: str | None = None, since: str | None = None,
           limit: int = 20) -> list[Hit]:
    """Logged turns matching ``query``, the best first."""
    query = query.strip()
    if not query or len(query) > MAX_QUERY_CHARS:
        raise UsageError(f"-q takes 1 to {MAX_QUERY_CHARS:,} characters")
    where, args = _filters(model, since, "l.")
    where = where.replace("WHERE ", "AND ") if where else ""
    if CJK.search(query):
        return _substring_search(conn, query, where, args, limit)
    try:
        rows = conn.execute(
            "SELECT l.uid, l.id, l.time, l.model, snippet(log_search, 0, ?, ?, '…', 12), "
            "snippet(log_search, 1, ?, ?, '…', 12), snippet(log_search, 2, ?, ?, '…', 12) "
            f"FROM log_search JOIN log l ON l.id = log_search.rowid WHERE log_search MATCH ? {where} "
            "ORDER BY bm25(log_search) LIMIT ?",
            (*(MARK_OPEN, MARK_CLOSE) * 3, query, *args, limit)).fetchall()
    except sqlite3.OperationalError as exc:
        if getattr(exc, "sqlite_errorcode", sqlite3.SQLITE_ERROR) == sqlite3.SQLITE_ERROR:  # the query, not the disk
            raise UsageError(f"-q {_short(query)!r} is not a query FTS5 can read ({exc}); put words in double "
                             'quotes to search for them as they are, e.g. -q \'"harbor 17"\'') from None
        raise
    return [_hit(uid, entry, when, model_, fields) for uid, entry, when, model_, *fields in rows]


def _hit(uid: str, entry: int, when: str, model: str | None, fields: list[str]) -> Hit:
    """The field whose snippet holds a marked term (the question first), as one line."""
    names = ("user", "assistant", "tools")
    field, text = next(((n, t) for n, t in zip(names, fields) if t and MARK_OPEN in t), ("user", fields[0] or ""))
    return Hit(uid=uid, entry=entry, time=when, model=model, field=field, line=" ".join(text.split()))


def _substring_search(conn: sqlite3.Connection, query: str, where: str, args: list[Any], limit: int) -> list[Hit]:
    pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = conn.execute(
        "SELECT l.uid, l.id, l.time, l.model, l.user, l.assistant, s.tools FROM log l JOIN log_search s "
        "ON s.rowid = l.id WHERE (l.user LIKE ? ESCAPE '\\' OR l.assistant LIKE ? ESCAPE '\\' OR s.tools LIKE ? "
        f"ESCAPE '\\') {where} ORDER BY l.id DESC LIMIT ?", (pattern, pattern, pattern, *args, limit)).fetchall()
    hits = []
    for uid, entry, when, model, *fields in rows:
        field, text = next((n, t) for n, t in zip(("user", "assistant", "tools"), fields) if t and query in t)
        at = text.index(query)
        line = text[max(0, at - 40):at] + MARK_OPEN + query + MARK_CLOSE + text[at + len(query):at + len(query) + 40]
        hits.append(Hit(uid=uid, entry=entry, time=when, model=model, field=field, line=" ".join(line.split())))
    return hits


def entries(conn: sqlite3.Connection, uid: str) -> list[tuple]:
    """A conversation's logged turns, in order: (time, model, user, assistant, reasoning, steps, stats, taken back,
    picture refs)."""
    return conn.execute("SELECT time, model, user, assistant, reasoning, steps, stats, taken_back, images FROM log "
                        "WHERE uid = ? ORDER BY id", (uid,)).fetchall()


def conversation_of(conn: sqlite3.Connection, key: str) -> str | None:
    """The uid a ``log show`` or ``log rm`` argument names: a name, a uid, or any part of one that
    only one uid holds (its start, or its random end: ``6fae``)."""
    named = conn.execute("SELECT uid FROM sessions WHERE name = ?", (key,)).fetchone()
    if named:
        return named[0]
    pattern = key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    for like in (pattern + "%", "%" + pattern + "%"):  # a start first: 2026 names one when it starts one
        found = conn.execute("SELECT DISTINCT uid FROM log WHERE uid LIKE ? ESCAPE '\\' LIMIT 2", (like,)).fetchall()
        if len(found) > 1:
            raise UsageError(f"{_short(key)!r} is part of more than one conversation's id: give more of it")
        if found:
            return found[0][0]
    return None


def remove(conn: sqlite3.Connection, uids: Sequence[str]) -> int:
    """The conversations ``uids`` gone, log and state; how many turns left the log."""
    removed = 0
    for uid in uids:
        conn.execute("DELETE FROM log_search WHERE rowid IN (SELECT id FROM log WHERE uid = ?)", (uid,))
        removed += conn.execute("DELETE FROM log WHERE uid = ?", (uid,)).rowcount
        conn.execute("DELETE FROM sessions WHERE uid = ?", (uid,))
    drop_unreferenced(conn)
    return removed


def older_than(conn: sqlite3.Connection, age: str) -> list[str]:
    """Conversations whose last turn is older than ``age`` (``30d``)."""
    when, args = since_clause(age)
    return [r[0] for r in conn.execute("SELECT uid FROM log GROUP BY uid HAVING MAX(time) < ?", args).fetchall()] \
        if when else []


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"
