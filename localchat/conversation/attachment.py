"""A file's text put into the next message (``/load FILE``): read safely, then quoted in the prompt.

Only a regular file is read (never a FIFO, a device or a directory, which could block or never
end), at most ``max_chars`` characters' worth of bytes; it must be UTF-8 text without NUL bytes.
The text joins the user's next message, named and fenced, so the model sees where it starts and
ends; the history builder then treats it as that message, nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

from localchat.errors import UsageError
from localchat.files import read_named

BYTES_PER_CHAR = 4  # UTF-8's longest character: the most bytes ``max_chars`` characters can take


@dataclass(frozen=True)
class Attachment:
    name: str  # as the user gave it
    text: str

    def into(self, message: str) -> str:
        """The user's message with this file's text in front of it."""
        fence = "````" if "```" in self.text else "```"
        return f"{self.name}:\n{fence}\n{self.text.rstrip()}\n{fence}\n\n{message}"


def read_attachment(path_text: str, max_chars: int) -> Attachment:
    """The file's text, or a UsageError saying in one line why it cannot be used."""
    _, data = read_named(path_text, max_chars * BYTES_PER_CHAR, "/load")
    return Attachment(path_text, _text_of(data, path_text, max_chars))


def _text_of(data: bytes, name: str, max_chars: int) -> str:
    if b"\0" in data[:8192]:
        raise UsageError(f"/load: {name} looks binary (it holds NUL bytes): only text files can be loaded")
    if len(data) > max_chars * BYTES_PER_CHAR:
        raise UsageError(f"/load: {name} is over {max_chars} characters (--max-input-chars)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"/load: {name} is not UTF-8 text (byte {exc.start})") from None
    if len(text) > max_chars:
        raise UsageError(f"/load: {name} is {len(text)} characters, over --max-input-chars ({max_chars})")
    if not text.strip():
        raise UsageError(f"/load: {name} is empty")
    return text
