"""Responses kept with ``store`` (the Responses API's default): in memory, the newest ``MAX_STORED``
within ``MAX_STORED_CHARS``, for ``previous_response_id`` and for ``GET``/``DELETE /v1/responses/{id}``."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from localchat.backends import Message
from localchat.serve.request import ApiError, invalid

MAX_STORED = 256
MAX_STORED_CHARS = 64 * 1024 * 1024


@dataclass
class ResponseStore:
    """Stored responses (the object, and its conversation for ``previous_response_id``), by id:
    bounded by count and size, the oldest dropped first."""

    entries: OrderedDict[str, tuple[list[Message], dict[str, Any], int]] = field(default_factory=OrderedDict)
    chars: int = 0

    def keep(self, response_id: str, messages: list[Message], response: dict[str, Any]) -> None:
        size = len(json.dumps(messages, ensure_ascii=False)) + len(json.dumps(response, ensure_ascii=False))
        if size > MAX_STORED_CHARS:
            return
        self.entries[response_id] = (messages, response, size)
        self.chars += size
        while len(self.entries) > MAX_STORED or self.chars > MAX_STORED_CHARS:
            self.chars -= self.entries.popitem(last=False)[1][2]

    def conversation(self, response_id: str) -> list[Message]:
        if response_id not in self.entries:
            raise invalid(f"previous_response_id: no response {response_id!r} is stored by this gateway (it keeps "
                          f"the last {MAX_STORED} responses made with store: true, in memory, until it restarts)",
                          "previous_response_id")
        return list(self.entries[response_id][0])

    def response(self, response_id: str) -> dict[str, Any]:
        """A stored response as it was returned; a 404 when it is not (or no longer) kept."""
        return self._entry(response_id)[1]

    def delete(self, response_id: str) -> None:
        self.chars -= self._entry(response_id)[2]
        del self.entries[response_id]

    def _entry(self, response_id: str) -> tuple[list[Message], dict[str, Any], int]:
        if response_id not in self.entries:
            raise ApiError(404, "invalid_request_error", f"no response {response_id!r} is stored by this gateway "
                           f"(it keeps the last {MAX_STORED} made with store: true, in memory, until it restarts)")
        return self.entries[response_id]
