"""Turn records: what exactly went to the model, and what came back.

For every model call, ``<session>-<turn>-request.json`` is written BEFORE the call and
``<session>-<turn>-response.json`` after it. Files are written atomically (temporary file, then
rename) with owner-only permissions, since they hold the user's words. If a record cannot be
written the chat stops (seed 001's failure table): no request record means no call is made; no
response record means the model is not called again just to produce one.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat.errors import LocalchatError
from localchat.files import write_atomic

FILE_MODE = 0o600
DIR_MODE = 0o700


class RecordError(LocalchatError):
    """A record could not be written; the chat must stop."""


def new_session_id() -> str:
    """Sortable by time, unique across concurrent sessions: ``20261130-181502-3f9a``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` so that the file is either absent or complete, mode 0600."""
    write_atomic(path, json.dumps(payload, ensure_ascii=False, indent=2).encode("utf-8") + b"\n", FILE_MODE)


@dataclass
class TurnRecorder:
    """Writes one request/response pair per model call into ``directory``."""

    directory: Path
    session_id: str = field(default_factory=new_session_id)
    turn: int = 0

    def request(self, payload: dict[str, Any]) -> str:
        """Record the request of the next turn; returns its id. Raises RecordError (no call)."""
        self.turn += 1
        record_id = f"{self.session_id}-{self.turn:04d}"
        try:
            self._ensure_directory()
            if payload.get("messages"):
                payload = {**payload, "messages": pictures_apart(payload["messages"], self.directory)}
            write_json_atomic(self.directory / f"{record_id}-request.json",
                              {"id": record_id, "session": self.session_id, "turn": self.turn,
                               "time": _now(), **payload})
        except OSError as exc:
            raise RecordError(f"cannot write the request record in {self.directory}: "
                              f"{exc.strerror or exc}; the model was not called") from None
        return record_id

    def response(self, record_id: str, payload: dict[str, Any]) -> None:
        try:
            write_json_atomic(self.directory / f"{record_id}-response.json",
                              {"id": record_id, "time": _now(), **payload})
        except OSError as exc:
            raise RecordError(f"cannot write the response record {record_id} in {self.directory}: "
                              f"{exc.strerror or exc}; the reply was shown but not kept, and the "
                              "model is not called again") from None

    def _ensure_directory(self) -> None:
        """Created owner-only; an existing directory keeps the permissions its owner chose."""
        if not self.directory.is_dir():
            self.directory.mkdir(mode=DIR_MODE, parents=True)
            os.chmod(self.directory, DIR_MODE)  # mkdir's mode is filtered by the umask


def pictures_apart(messages: list[dict[str, Any]], directory: Path) -> list[dict[str, Any]]:
    """The messages with each picture's data URL replaced by the file that holds its bytes,
    ``images/<sha256>.<ext>`` beside the records (written once, whatever the number of turns that send it)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [_picture_file(part, directory) if part.get("type") == "image_url" else part for part in content]
            message = {**message, "content": content}
        out.append(message)
    return out


def _picture_file(part: dict[str, Any], directory: Path) -> dict[str, Any]:
    import hashlib

    from localchat.vision.image import bytes_of_data_url

    url = part["image_url"]["url"]
    if not url.startswith("data:"):
        return part
    data = bytes_of_data_url(url)
    digest = hashlib.sha256(data).hexdigest()
    suffix = url[len("data:image/"):url.index(";")] if url.startswith("data:image/") else "bin"
    name = f"images/{digest}.{suffix.replace('jpeg', 'jpg')}"
    if not (directory / name).exists():
        (directory / "images").mkdir(mode=DIR_MODE, exist_ok=True)
        write_atomic(directory / name, data, FILE_MODE)
    return {**part, "image_url": {**part["image_url"], "url": name}}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
