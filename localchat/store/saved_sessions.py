"""Conversations, kept in one SQLite database in the user's localchat home (``schema``).

Every conversation has a row (its ``uid``) with what resuming needs: system message, accepted turns
with their figures, pins and notes, model, backend, generation parameters; it has a ``name`` once it
is saved under one (``/save NAME``). Every accepted turn is also appended to the log
(``conversation_log``), in the transaction that keeps the conversation's state. Every write is one
``BEGIN IMMEDIATE`` transaction, so concurrent REPLs wait for each other (up to ``BUSY_TIMEOUT_S``,
the database in WAL mode) instead of interleaving; a database that cannot be read is reported and
left untouched. The file is the user's alone (0600, in a 0700 directory).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from localchat import bounded_json
from localchat.conversation.history import Turn
from localchat.conversation.stats import stats_from_dict, stats_to_dict
from localchat.errors import LocalchatError, UsageError
from localchat.files import private_dirs
from localchat.store.pictures import drop_unreferenced, keep_pictures, read_pictures, refs_json
from localchat.store.schema import MIGRATIONS
from localchat.store.tool_steps import tool_steps
from localchat.vision.image import Picture

DB_NAME = "sessions.sqlite3"
BUSY_TIMEOUT_S = 10.0
KEEPING_BUSY_TIMEOUT_S = 1.0  # a chat keeping its turns waits this long for another writer, not a whole turn
COLUMNS = "id, name, uid, model, backend, system, params, created, updated, pins, summary, revision"


@dataclass(frozen=True)
class SavedSession:
    name: str | None  # None: a conversation kept, never saved under a name
    uid: str  # the conversation's identity: keeping it again updates it, another one may not take its name
    model: str | None
    backend: str
    system: str | None
    params: dict[str, Any]
    turns: tuple[Turn, ...]  # with their figures
    created: str = ""
    updated: str = ""
    pins: tuple[str, ...] = ()
    summary: str | None = None  # the notes that replaced earlier turns (those turns are not kept)
    revision: int = 0  # how many writes the stored state has had (a write on an older one is refused)


class ContinuedElsewhere(UsageError):
    """A conversation's write built on a state another page, tab or terminal has written over since:
    refused, so no kept turn is ever written over."""


@dataclass(frozen=True)
class Written:
    replaced: bool  # an earlier save under this name was replaced
    revision: int  # the state's revision now


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
    busy_timeout_s: float = BUSY_TIMEOUT_S  # how long a write waits for another writer's lock

    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection inside one transaction; sqlite errors become one-line StoreErrors."""
        if not write and not self.path.exists():
            raise SessionNotFound(f"no saved sessions yet ({self.path} does not exist)")
        try:
            conn = self._open()
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
                raise StoreError(f"the session database {self.path} stayed locked for {self.busy_timeout_s:g}s "
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

    def _open(self) -> sqlite3.Connection:
        """The database, made private first (0600 in a 0700 directory: the WAL files take its mode),
        in WAL mode where it can be (two REPLs at once read while the other writes)."""
        fresh = not self.path.exists()
        private_dirs(self.path.parent)
        if fresh:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600))
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.DatabaseError:  # read-only (the rollback journal then), or not a database: said next
            pass
        return conn

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

    def save(self, session: SavedSession, log: Sequence[Turn] = (), take_back: int = 0,
             based_on: int | None = None) -> Written:
        """Keep ``session``'s state (its row, by uid; renamed when it has a new name), append the
        ``log`` turns to its log and mark its last ``take_back`` logged turns as taken back, in one
        transaction. A name held by a different conversation is refused, so no save overwrites
        another; so is a state built on revision ``based_on`` when the stored one has moved on
        (another page or terminal kept a turn since): ``ContinuedElsewhere``."""
        from localchat.store.conversation_log import append_turns, mark_taken_back

        with self._connect(write=True) as conn:
            if session.name is not None:
                holder = conn.execute("SELECT uid FROM sessions WHERE name = ?", (session.name,)).fetchone()
                if holder and holder[0] != session.uid:
                    raise UsageError(f"another conversation is already saved as '{session.name}': pick another "
                                     f"name, or remove it first (localchat sessions rm {session.name})")
            row = conn.execute("SELECT id, name, revision FROM sessions WHERE uid = ?", (session.uid,)).fetchone()
            if row and based_on is not None and row[2] != based_on:
                kept = conn.execute("SELECT COUNT(*) FROM turns WHERE session_id = ?", (row[0],)).fetchone()[0]
                raise ContinuedElsewhere(f"this conversation was continued elsewhere since it was opened here (it "
                                         f"now holds {kept} turns): this turn was not kept; open it again to go on "
                                         "from its latest turn")
            values = (session.name if session.name is not None else row[1] if row else None, _now(), session.model,
                      session.backend, session.system, json.dumps(session.params),
                      json.dumps(list(session.pins)) if session.pins else None, session.summary)
            if row:
                conn.execute("UPDATE sessions SET name = ?, updated = ?, model = ?, backend = ?, system = ?, params = "
                             "?, pins = ?, summary = ?, revision = revision + 1 WHERE id = ?", (*values, row[0]))
                conn.execute("DELETE FROM turns WHERE session_id = ?", (row[0],))
                key = row[0]
            else:
                key = conn.execute("INSERT INTO sessions (uid, created, name, updated, model, backend, system, params, "
                                   "pins, summary) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                   (session.uid, _now(), *values)).lastrowid
            conn.executemany(
                "INSERT INTO turns (session_id, position, user, assistant, stats, reasoning, steps, images) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(key, i, t.user, t.assistant, json.dumps(stats_to_dict(t.stats)) if t.stats else None,
                  t.reasoning or None, json.dumps([asdict(step) for step in t.steps]) if t.steps else None,
                  refs_json(t.images))
                 for i, t in enumerate(session.turns)])
            keep_pictures(conn, (p for t in (*session.turns, *log) for p in t.images))
            mark_taken_back(conn, session.uid, take_back)
            append_turns(conn, session, log)
            revision = row[2] + 1 if row else 0
            return Written(replaced=bool(row and row[1] is not None and row[1] == session.name), revision=revision)

    def revision_of(self, uid: str) -> int | None:
        """The stored state's revision, None when it is not kept (or the database cannot say)."""
        if not self.path.exists():
            return None
        try:
            with self._connect() as conn:
                row = conn.execute("SELECT revision FROM sessions WHERE uid = ?", (uid,)).fetchone()
        except LocalchatError:
            return None
        return row[0] if row and isinstance(row[0], int) else None

    def load(self, name: str) -> SavedSession:
        """A conversation by its name, or by its id (``localchat log`` shows both)."""
        validate_name(name)
        with self._connect() as conn:
            row = conn.execute(f"SELECT {COLUMNS} FROM sessions WHERE name = ? OR (uid = ? AND name IS NULL) "
                               "ORDER BY name IS NULL LIMIT 1", (name, name)).fetchone()
            if row is None:
                raise SessionNotFound(f"no saved session named {shown_name(name)} (see: localchat sessions list, "
                                      "localchat log)")
            return _session_from_rows(row, self._turns(conn, row[0]), partial(read_pictures, conn))

    def latest(self) -> SavedSession | None:
        """The conversation kept most recently (``chat --continue``), or None."""
        if not self.path.exists():
            return None
        with self._connect() as conn:
            row = conn.execute(f"SELECT {COLUMNS} FROM sessions ORDER BY updated DESC, id DESC LIMIT 1").fetchone()
            return _session_from_rows(row, self._turns(conn, row[0]), partial(read_pictures, conn)) if row else None

    @staticmethod
    def _turns(conn: sqlite3.Connection, key: int) -> list[tuple]:
        return conn.execute("SELECT user, assistant, stats, reasoning, steps, images FROM turns WHERE session_id = ? "
                            "ORDER BY position", (key,)).fetchall()

    def list(self) -> list[SessionSummary]:
        """The conversations saved under a name, newest first."""
        if not self.path.exists():
            return []
        with self._connect() as conn:
            rows = conn.execute("SELECT s.name, COUNT(t.position), s.model, s.backend, s.updated FROM sessions s "
                                "LEFT JOIN turns t ON t.session_id = s.id WHERE s.name IS NOT NULL GROUP BY s.id "
                                "ORDER BY s.updated DESC, s.name").fetchall()
        cleaned: list[list[Any]] = [[v if v is None or isinstance(v, (str, int)) else "(damaged)" for v in row]
                                    for row in rows]
        return [SessionSummary(*row) for row in cleaned]

    def remove(self, name: str) -> str:
        """The conversation NAME (or of that id) gone, its log with it; its uid (for its KV cache)."""
        validate_name(name)
        if not self.path.exists():
            raise SessionNotFound(f"no saved sessions yet ({self.path} does not exist)")
        with self._connect(write=True) as conn:
            row = conn.execute("SELECT id, uid FROM sessions WHERE name = ? OR (uid = ? AND name IS NULL)",
                               (name, name)).fetchone()
            if row is None:
                raise SessionNotFound(f"no saved session named {shown_name(name)} (see: localchat sessions list)")
            conn.execute("DELETE FROM sessions WHERE id = ?", (row[0],))
            conn.execute("DELETE FROM log_search WHERE rowid IN (SELECT id FROM log WHERE uid = ?)", (row[1],))
            conn.execute("DELETE FROM log WHERE uid = ?", (row[1],))
            drop_unreferenced(conn)
            return row[1]

    def connect(self, write: bool = False):
        """A transaction on the database, for the log's own queries (``conversation_log``)."""
        return self._connect(write)


def _session_from_rows(row: tuple, turns: list[tuple],
                       pictures: Callable[[Any], tuple[Picture, ...]] = lambda _: ()) -> SavedSession:
    """A saved session as stored by any version; a damaged field is one error naming it (the
    turns' figures are only figures: unknown or missing ones are tolerated)."""
    name = row[1] if isinstance(row[1], str) else row[2]  # a conversation never named is known by its id

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
    for position, (user, assistant, stats, reasoning, steps, images) in enumerate(turns, 1):
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
        try:
            shown = pictures(images)
        except ValueError as exc:
            raise damaged(f"turn {position} pictures", str(exc).removeprefix("the ")) from None
        loaded.append(Turn(user, assistant, figures, reasoning or "", rounds, images=shown))
    return SavedSession(name=row[1] if isinstance(row[1], str) else None, uid=row[2], model=row[3], backend=row[4],
                        system=row[5], params=params,
                        turns=tuple(loaded), created=row[7], updated=row[8], pins=tuple(pins), summary=row[10],
                        revision=row[11] if isinstance(row[11], int) else 0)


def default_store(busy_timeout_s: float = BUSY_TIMEOUT_S) -> SessionStore:
    from localchat.home import home_dir

    return SessionStore(home_dir() / DB_NAME, busy_timeout_s=busy_timeout_s)


def validate_name(name: str) -> str:
    """Names are typed on command lines: letters, digits, '.', '_' and '-', at most 64."""
    if not name or len(name) > 64 or not all(c.isalnum() or c in "._-" for c in name) \
            or name in (".", ".."):
        raise UsageError(f"invalid session name {shown_name(name)}: use letters, digits, '.', '_' or '-' (at most 64)")
    return name
