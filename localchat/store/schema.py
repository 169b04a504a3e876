"""The sessions database's schema, versioned with ``PRAGMA user_version``: ``MIGRATIONS[i]`` turns
version i into i + 1, each inside the transaction that opens the database.

Version 5 keeps every conversation, not only the saved ones: ``sessions`` holds each conversation's
current state (what resuming needs), one row a conversation (``uid``), its ``name`` only once it is
saved under one; ``log`` holds every accepted turn as it was kept, in order, never rewritten (a
turn taken back with ``/undo`` or replaced by ``/retry`` is marked so), with ``log_search`` its
full-text index (FTS5) of questions, answers and tool results. The step from 4 copies everything
over: each saved conversation (the latest save of it, when one was saved under several names; the
others keep their rows under a uid of their own), its turns, and its turns again into the log.
"""

from __future__ import annotations

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
    """
    CREATE TABLE sessions_v5 (
        id INTEGER PRIMARY KEY,
        name TEXT UNIQUE,
        uid TEXT NOT NULL UNIQUE,
        created TEXT NOT NULL,
        updated TEXT NOT NULL,
        model TEXT,
        backend TEXT NOT NULL,
        system TEXT,
        params TEXT NOT NULL,
        pins TEXT,
        summary TEXT
    );
    INSERT INTO sessions_v5 (id, name, uid, created, updated, model, backend, system, params, pins, summary)
        SELECT s.id, s.name,
               CASE WHEN s.id = (SELECT MAX(o.id) FROM sessions o WHERE o.uid = s.uid) THEN s.uid
                    ELSE s.uid || '-' || s.id END,
               s.created, s.updated, s.model, s.backend, s.system, s.params, s.pins, s.summary
        FROM sessions s;
    CREATE TABLE turns_v5 (
        session_id INTEGER NOT NULL REFERENCES sessions_v5(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        user TEXT NOT NULL,
        assistant TEXT NOT NULL,
        stats TEXT,
        reasoning TEXT,
        steps TEXT,
        PRIMARY KEY (session_id, position)
    );
    INSERT INTO turns_v5 SELECT session_id, position, user, assistant, stats, reasoning, steps FROM turns;
    DROP TABLE turns;
    DROP TABLE sessions;
    ALTER TABLE sessions_v5 RENAME TO sessions;
    ALTER TABLE turns_v5 RENAME TO turns;
    CREATE TABLE log (
        id INTEGER PRIMARY KEY,
        uid TEXT NOT NULL,
        time TEXT NOT NULL,
        model TEXT,
        backend TEXT NOT NULL,
        user TEXT NOT NULL,
        assistant TEXT NOT NULL,
        reasoning TEXT,
        steps TEXT,
        stats TEXT,
        taken_back INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX log_by_conversation ON log (uid, id);
    CREATE VIRTUAL TABLE log_search USING fts5(user, assistant, tools, tokenize = 'unicode61 remove_diacritics 2');
    INSERT INTO log (uid, time, model, backend, user, assistant, reasoning, steps, stats)
        SELECT s.uid, s.updated, s.model, s.backend, t.user, t.assistant, t.reasoning, t.steps, t.stats
        FROM turns t JOIN sessions s ON s.id = t.session_id ORDER BY s.id, t.position;
    INSERT INTO log_search (rowid, user, assistant, tools) SELECT id, user, assistant, COALESCE(steps, '') FROM log;
    """,
    # pictures: their bytes once by content hash; the turns that carried them keep refs (store/pictures.py)
    """
    ALTER TABLE turns ADD COLUMN images TEXT;
    ALTER TABLE log ADD COLUMN images TEXT;
    CREATE TABLE images (digest TEXT PRIMARY KEY, mime TEXT NOT NULL, data BLOB NOT NULL);
    """,
    # each write of a conversation's state counts up: a write built on an older state is refused
    "ALTER TABLE sessions ADD COLUMN revision INTEGER NOT NULL DEFAULT 0",
]
