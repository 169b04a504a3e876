"""Saved conversations: one SQLite database in the user's localchat home.

A saved session holds what resuming needs (system message, accepted turns with their figures,
model, backend, generation parameters). Every write is one ``BEGIN IMMEDIATE`` transaction, so
concurrent REPLs saving to the same file wait for each other (up to ``BUSY_TIMEOUT_S``) instead of
interleaving; a database that cannot be read is reported and left untouched. The schema is
versioned with ``PRAGMA user_version``; ``MIGRATIONS[i]`` upgrades version i to i + 1.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localchat import bounded_json
from localchat.conversation.history import ToolStep, Turn
from localchat.conversation.stats import stats_from_dict, stats_to_dict
from localchat.conversation.turn import ChatSession
from localchat.errors import LocalchatError, UsageError
from localchat.store.session_cache import CacheWrite, SessionCaches, write_cache

DB_NAME = "sessions.sqlite3"
BUSY_TIMEOUT_S = 10.0
MIGRATIONS = [
    """
    CREATE TABLE sessions (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        uid TEXT NOT NULL,
        created TEXT NOT NULL,
        updated TEXT NOT NULL,
        model TEXT,
        backend TEXT NOT NULL,
        system TEXT,
        params TEXT NOT NULL
    );
    CREATE TABLE turns (
        session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        user TEXT NOT NULL,
        assistant TEXT NOT NULL,
        stats TEXT,
        PRIMARY KEY (session_id, position)
    );
    """,
    "ALTER TABLE turns ADD COLUMN reasoning TEXT",  # a thinking model's reasoning, beside the answer
    # pinned facts (a JSON list of texts) and the notes of a compaction, both after the system message
    "ALTER TABLE sessions ADD COLUMN pins TEXT; ALTER TABLE sessions ADD COLUMN summary TEXT",
    "ALTER TABLE turns ADD COLUMN steps TEXT",  # a turn's rounds of tool calls and their results (JSON)
]


@dataclass(frozen=True)
class SavedSession:
    name: str
    uid: str  # the conversation's identity: re-saving it updates, another one may not take its name
    model: str | None
    backend: str
    system: str | None
    params: dict[str, Any]
    turns: tuple[Turn, ...]  # with their figures
    created: str = ""
    updated: str = ""
    pins: tuple[str, ...] = ()
    summary: str | None = None  # the notes that replaced earlier turns (those turns are not kept)


@dataclass(frozen=True)
class SessionSummary:
    name: str
    turns: int
    model: str | None
    backend: str
    updated: str


class StoreError(LocalchatError):
    pass


class SessionNotFound(StoreError):
    """No saved session by that name (exit 1: the name was well formed, there is just none)."""


def shown_name(name: str, width: int = 40) -> str:
    """A name as typed, quoted and escaped (``repr``), cut to ``width``: one short line whatever it holds."""
    return repr(name) if len(name) <= width else repr(name[:width]) + f"… ({len(name)} characters)"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


@dataclass
class SessionStore:
    path: Path

    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection inside one transaction; sqlite errors become one-line StoreErrors."""
        if not write and not self.path.exists():
            raise SessionNotFound(f"no saved sessions yet ({self.path} does not exist)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the session database {self.path}: {exc}") from None
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            self._migrate(conn)
            yield conn
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            conn.rollback()
            if "locked" in str(exc) or "busy" in str(exc):
                raise StoreError(f"the session database {self.path} stayed locked for {BUSY_TIMEOUT_S:.0f}s "
                                 "(another localchat is writing?); nothing was changed") from None
            raise StoreError(f"session database {self.path}: {exc}; nothing was changed") from None
        except sqlite3.DatabaseError as exc:
            conn.rollback()
            raise StoreError(f"the session database {self.path} is unreadable ({exc}); it was left "
                             "as it is — move it away to start a new one") from None
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise StoreError(f"the session database {self.path} is schema version {version}, newer than "
                             f"this localchat understands ({len(MIGRATIONS)}); upgrade localchat")
        for number in range(version, len(MIGRATIONS)):
            for statement in MIGRATIONS[number].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number + 1}")

    def save(self, session: SavedSession) -> bool:
        """Insert or update ``session`` under its name; True when it replaced an earlier save.
        A name held by a different conversation is refused, so no save overwrites another."""
        with self._connect(write=True) as conn:
            row = conn.execute("SELECT id, uid, created FROM sessions WHERE name = ?", (session.name,)).fetchone()
            if row and row[1] != session.uid:
                raise UsageError(f"another conversation is already saved as '{session.name}': pick another "
                                 f"name, or remove it first (localchat sessions rm {session.name})")
            if row:
                conn.execute("DELETE FROM sessions WHERE id = ?", (row[0],))
            created = row[2] if row else _now()
            cursor = conn.execute(
                "INSERT INTO sessions (name, uid, created, updated, model, backend, system, params, pins, summary) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session.name, session.uid, created, _now(), session.model, session.backend, session.system,
                 json.dumps(session.params), json.dumps(list(session.pins)) if session.pins else None, session.summary))
            conn.executemany(
                "INSERT INTO turns (session_id, position, user, assistant, stats, reasoning, steps) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(cursor.lastrowid, i, t.user, t.assistant, json.dumps(stats_to_dict(t.stats)) if t.stats else None,
                  t.reasoning or None, json.dumps([asdict(step) for step in t.steps]) if t.steps else None)
                 for i, t in enumerate(session.turns)])
            return row is not None

    def load(self, name: str) -> SavedSession:
        validate_name(name)
        with self._connect() as conn:
            row = conn.execute("SELECT id, name, uid, model, backend, system, params, created, updated, pins, "
                               "summary FROM sessions WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise SessionNotFound(f"no saved session named {shown_name(name)} (see: localchat sessions list)")
            turns = conn.execute("SELECT user, assistant, stats, reasoning, steps FROM turns WHERE session_id = ? "
                                 "ORDER BY position", (row[0],)).fetchall()
        return _session_from_rows(row, turns)

    def list(self) -> list[SessionSummary]:
        if not self.path.exists():
            return []
        with self._connect() as conn:
            rows = conn.execute("SELECT s.name, COUNT(t.position), s.model, s.backend, s.updated FROM sessions s "
                                "LEFT JOIN turns t ON t.session_id = s.id GROUP BY s.id "
                                "ORDER BY s.updated DESC, s.name").fetchall()
        return [SessionSummary(*(v if v is None or isinstance(v, (str, int)) else "(damaged)" for v in row))
                for row in rows]

    def remove(self, name: str) -> None:
        validate_name(name)
        if not self.path.exists():
            raise SessionNotFound(f"no saved sessions yet ({self.path} does not exist)")
        with self._connect(write=True) as conn:
            if conn.execute("DELETE FROM sessions WHERE name = ?", (name,)).rowcount == 0:
                raise SessionNotFound(f"no saved session named {shown_name(name)} (see: localchat sessions list)")


def _session_from_rows(row: tuple, turns: list[tuple]) -> SavedSession:
    """A saved session as stored by any version; a damaged field is one error naming it (the
    turns' figures are only figures: unknown or missing ones are tolerated)."""
    name = row[1]

    def damaged(field: str, why: str) -> StoreError:
        return StoreError(f"saved session '{name}' is damaged: {field} {why}; the other sessions are "
                          f"untouched (remove this one with: localchat sessions rm {name})")

    texts = {"uid": row[2], "backend": row[4], "created": row[7], "updated": row[8]}
    for field, value in texts.items():
        if not isinstance(value, str):
            raise damaged(field, "is not text")
    for field, value in (("model", row[3]), ("system", row[5]), ("summary", row[10])):
        if value is not None and not isinstance(value, str):
            raise damaged(field, "is not text")
    try:
        pins = bounded_json.loads(row[9]) if row[9] is not None else []
    except (TypeError, ValueError):
        raise damaged("pins", "is not JSON") from None
    if not isinstance(pins, list) or not all(isinstance(p, str) for p in pins):
        raise damaged("pins", "is not a list of texts")
    try:
        params = bounded_json.loads(row[6])
    except (TypeError, ValueError):
        raise damaged("params", "is not JSON") from None
    if not isinstance(params, dict):
        raise damaged("params", "is not a JSON object")
    loaded = []
    for position, (user, assistant, stats, reasoning, steps) in enumerate(turns, 1):
        if not isinstance(user, str) or not isinstance(assistant, str):
            raise damaged(f"turn {position}", "has a message that is not text")
        if reasoning is not None and not isinstance(reasoning, str):
            raise damaged(f"turn {position} reasoning", "is not text")
        try:
            figures = stats_from_dict(bounded_json.loads(stats)) if stats else None
        except (TypeError, ValueError):
            raise damaged(f"turn {position} stats", "is not JSON") from None
        try:
            rounds = tool_steps(bounded_json.loads(steps)) if steps is not None else ()
        except (TypeError, ValueError):
            raise damaged(f"turn {position} tool calls", "are not whole (each call needs its result)") from None
        loaded.append(Turn(user, assistant, figures, reasoning or "", rounds))
    return SavedSession(name=name, uid=row[2], model=row[3], backend=row[4], system=row[5], params=params,
                        turns=tuple(loaded), created=row[7], updated=row[8], pins=tuple(pins), summary=row[10])


def tool_steps(data: Any) -> tuple[ToolStep, ...]:
    """Stored rounds of tool calls, checked whole: every call with an id, a name and its result
    (ValueError otherwise: a half-kept round must never reach a template)."""
    if not isinstance(data, list):
        raise ValueError("not a list")
    steps = []
    for raw in data:
        if not isinstance(raw, dict) or not isinstance(raw.get("text"), str) \
                or not isinstance(raw.get("reasoning", ""), str):
            raise ValueError("not a round")
        calls, results = raw.get("calls"), raw.get("results")
        if not isinstance(calls, list) or not isinstance(results, list) or not calls or len(calls) != len(results):
            raise ValueError("calls and results do not pair")
        if not all(isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("name"), str)
                   and isinstance(c.get("arguments"), (dict, str)) for c in calls) \
                or not all(isinstance(r, str) for r in results):
            raise ValueError("a call or a result is malformed")
        steps.append(ToolStep(raw["text"], tuple(calls), tuple(results), raw.get("reasoning", "")))
    return tuple(steps)


@dataclass(frozen=True)
class Saved:
    name: str
    replaced: bool  # an earlier save of this conversation under the name
    cache: CacheWrite | None  # None: this backend keeps no cache, or --no-save-cache


@dataclass
class SessionSaver:
    """What ``/save`` needs besides the live session: where, under which identity and name."""

    store: SessionStore
    uid: str
    model: str | None
    name: str | None = None  # the last name saved (or resumed) under; /save without NAME reuses it
    caches: SessionCaches | None = None
    saved_state: tuple | None = None  # ``saved_state(...)`` at the last save (or resume)

    def save(self, session: ChatSession, name: str | None = None) -> Saved:
        """Save the accepted turns, then the KV cache beside them."""
        name = validate_name(name) if name else (self.name or f"chat-{self.uid}")
        conversation = session.conversation
        replaced = self.store.save(SavedSession(
            name=name, uid=self.uid, model=self.model, backend=session.backend.name,
            system=conversation.system, params=asdict(session.params), turns=tuple(conversation.turns),
            pins=tuple(conversation.pins), summary=conversation.summary.text if conversation.summary else None))
        self.name = name
        self.saved_state = saved_state(conversation.turns, conversation.pins,
                                       conversation.summary.text if conversation.summary else None)
        cache = write_cache(session, self.uid, name, self.caches) if self.caches else None
        return Saved(name=name, replaced=replaced, cache=cache)

    def unsaved(self, session: ChatSession) -> bool:
        """Turns, pins or notes changed since the last save (or the resume)."""
        conversation = session.conversation
        return self.saved_state != saved_state(conversation.turns, conversation.pins,
                                               conversation.summary.text if conversation.summary else None)


def saved_state(turns: Sequence[Turn], pins: Sequence[str], summary: str | None) -> tuple:
    """What a save keeps of a conversation, comparable."""
    return tuple(turns), tuple(pins), summary


def default_store() -> SessionStore:
    from localchat.store.home import home_dir

    return SessionStore(home_dir() / DB_NAME)


def validate_name(name: str) -> str:
    """Names are typed on command lines: letters, digits, '.', '_' and '-', at most 64."""
    if not name or len(name) > 64 or not all(c.isalnum() or c in "._-" for c in name) \
            or name in (".", ".."):
        raise UsageError(f"invalid session name {shown_name(name)}: use letters, digits, '.', '_' or '-' (at most 64)")
    return name
