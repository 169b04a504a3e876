"""Pictures in the sessions database: each picture's bytes once, by content hash, in ``images``;
a turn (saved or logged) keeps only the refs (a JSON list of ``ImageRef``), so a picture sent in
many turns or kept in many conversations is stored once. Removing a conversation removes the
pictures no turn refers to any more."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from localchat import bounded_json
from localchat.vision.image import ImageRef, Picture

UNREFERENCED = """
    DELETE FROM images WHERE digest NOT IN (
        SELECT json_extract(j.value, '$.digest') FROM turns t, json_each(t.images) j WHERE t.images IS NOT NULL
        UNION SELECT json_extract(j.value, '$.digest') FROM log l, json_each(l.images) j WHERE l.images IS NOT NULL)
"""


def refs_json(pictures: tuple[Picture, ...]) -> str | None:
    """What a turn's row keeps of its pictures (None: it has none)."""
    return json.dumps([p.ref.to_dict() for p in pictures], ensure_ascii=False) if pictures else None


def keep_pictures(conn: sqlite3.Connection, pictures: Iterable[Picture]) -> None:
    """Each picture's bytes, unless a row already holds them."""
    conn.executemany("INSERT OR IGNORE INTO images (digest, mime, data) VALUES (?, ?, ?)",
                     [(p.ref.digest, p.ref.mime, p.data) for p in pictures])


def read_pictures(conn: sqlite3.Connection, raw: Any) -> tuple[Picture, ...]:
    """A turn's pictures from its refs; ValueError when a ref is malformed or its bytes are missing
    or not what the ref's hash says (the store was damaged)."""
    if raw is None:
        return ()
    refs = bounded_json.loads(raw) if isinstance(raw, str) else None
    if not isinstance(refs, list):
        raise ValueError("the picture list is not a list")
    pictures = []
    for item in refs:
        try:
            ref = ImageRef.from_dict(item)
        except (KeyError, TypeError, ValueError):
            raise ValueError("a picture's entry is malformed") from None
        row = conn.execute("SELECT data FROM images WHERE digest = ?", (ref.digest,)).fetchone()
        if row is None or not isinstance(row[0], bytes) or hashlib.sha256(row[0]).hexdigest() != ref.digest:
            raise ValueError(f"the picture {ref.name} is missing or damaged")
        pictures.append(Picture(ref=ref, data=row[0]))
    return tuple(pictures)


def drop_unreferenced(conn: sqlite3.Connection) -> None:
    conn.execute(UNREFERENCED)
