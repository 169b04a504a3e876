"""Untrusted text made harmless for a terminal: the one sanitiser.

A model's or a server's text can hold control characters and escape sequences that set the
window's title, clear or recolour the screen, write the clipboard (OSC 52), plant links (OSC 8) or
make the terminal answer into the next prompt. ``visible`` shows every C0 control but newline and
tab, DEL and every C1 control as printable text instead (``^[`` for ESC, ``\\x9b`` for CSI), which
turns any ESC/CSI/OSC/DCS sequence into plain characters; a carriage return is dropped only as
the first half of CRLF. ``cli.terminal`` applies it to everything a terminal is shown; data
(pipes, ``--json``, records, saved sessions) keeps the exact text.
"""

from __future__ import annotations

import re

CONTROL = re.compile(r"\r\n|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _shown(match: re.Match) -> str:
    char = match[0]
    if char == "\r\n":
        return "\n"
    code = ord(char)
    if code < 0x20:
        return "^" + chr(code + 0x40)  # caret notation, as `cat -v`: ESC is ^[, BEL ^G, CR ^M
    return "^?" if code == 0x7F else f"\\x{code:02x}"


def visible(text: str) -> str:
    """``text`` with every control character but newline and tab shown as printable text."""
    return CONTROL.sub(_shown, text) if CONTROL.search(text) else text


def has_controls(text: str) -> bool:
    """Whether ``text`` holds a control character a terminal could act on (CRLF is a line end)."""
    return visible(text) != text.replace("\r\n", "\n")


def valid_unicode(text: str) -> str:
    """``text`` with every lone surrogate (``"\\ud800"`` from a JSON escape) as U+FFFD: text that
    cannot be encoded would fail the next request, or a file, much later than it arrived."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
