"""Where a relayed HTTP/1.1 body ends, and its payload when it comes in chunks. Our engines answer
HTTP/1.0 and end a body by closing the connection; another localchat front (``gateway --upstream``
before a ``serve``), or any HTTP/1.1 server, sends a stream in chunks or a length ahead. The relay
reads those bodies here, as they arrive in pieces split anywhere, and writes on only their payload
(its own server frames it again for its client).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

SIZE_LINE_BYTES = 1 << 12  # a chunk's size line (with extensions) or a trailer line: far below this
NO_BODY = (204, 304)


class FramingError(ValueError):
    """The body's frames are not HTTP's (a size that is not hex, a line with no end)."""


class Framing(Protocol):
    """A body read to its end: the payload of each piece, and whether the body is over."""

    done: bool

    def payload(self, piece: bytes) -> bytes:
        """What of ``piece`` is the body's data (``FramingError`` when it is not HTTP's framing)."""


@dataclass
class Counted:
    """A body of ``Content-Length`` bytes (what comes after them is not this reply's)."""

    left: int = 0
    done: bool = False

    def __post_init__(self) -> None:
        self.done = self.left <= 0

    def payload(self, piece: bytes) -> bytes:
        piece = piece[:self.left]
        self.left -= len(piece)
        self.done = self.left <= 0
        return piece


@dataclass
class Chunked:
    """A ``Transfer-Encoding: chunked`` body: each chunk's size line, its data and its CRLF, then a
    zero size and the trailer, up to its empty line."""

    held: bytes = b""  # a size line, a CRLF or a trailer line split across pieces
    left: int = 0  # the current chunk's data still to come
    crlf_due: bool = False  # the CRLF that ends a chunk's data
    in_trailer: bool = False
    done: bool = False

    def payload(self, piece: bytes) -> bytes:
        data = self.held + piece if self.held else piece
        self.held, out, at = b"", [], 0
        while not self.done and at < len(data):
            if self.left:
                taken = data[at:at + self.left]
                out.append(taken)
                at += len(taken)
                self.left -= len(taken)
                self.crlf_due = not self.left
            elif self.crlf_due:
                if len(data) - at < 2:
                    break
                if data[at:at + 2] != b"\r\n":
                    raise FramingError("a chunk's data is not followed by CRLF")
                at, self.crlf_due = at + 2, False
            else:
                end = data.find(b"\r\n", at)
                if end < 0:
                    break
                self._line(data[at:end])
                at = end + 2
        self.held = data[at:] if not self.done else b""
        if len(self.held) > SIZE_LINE_BYTES:
            raise FramingError("a chunk's size line has no end")
        return out[0] if len(out) == 1 else b"".join(out)

    def _line(self, line: bytes) -> None:
        """A size line, or (after the zero size) a trailer line: the empty one ends the body."""
        if self.in_trailer:
            self.done = not line
            return
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise FramingError(f"a chunk's size is not hex: {line[:40]!r}") from None
        if size < 0:
            raise FramingError(f"a chunk's size is negative: {line[:40]!r}")
        self.in_trailer, self.left = size == 0, size


def framing_for(status: int, headers: dict[str, str], method: str) -> Framing | None:
    """How the body after this head ends: None when the connection's close ends it (HTTP/1.0, our
    engines: each piece passes as it is)."""
    if method == "HEAD" or status in NO_BODY or 100 <= status < 200:
        return Counted(left=0)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return Chunked()
    length = headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise FramingError(f"a Content-Length that is not a number: {length[:40]!r}")
        return Counted(left=int(length))
    return None
