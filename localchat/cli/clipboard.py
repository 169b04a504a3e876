"""``/copy``: text to the system clipboard through the platform's own tool."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from localchat.errors import LocalchatError

TIMEOUT_S = 5.0


def clipboard_commands() -> list[list[str]]:
    """The tools to try, in order: pbcopy on macOS; wl-copy under Wayland, then xclip and xsel."""
    if sys.platform == "darwin":
        return [["pbcopy"]]
    tools = [["wl-copy"]] if os.environ.get("WAYLAND_DISPLAY") else []
    return tools + [["xclip", "-selection", "clipboard"], ["xsel", "--clipboard", "--input"]]


def copy_to_clipboard(text: str) -> str:
    """Copy ``text``; the tool's name, or a LocalchatError in one line. The tool's output is not
    read: xclip stays behind to serve the selection, holding any pipe it was given open."""
    candidates = clipboard_commands()
    for command in candidates:
        if shutil.which(command[0]) is None:
            continue
        try:
            done = subprocess.run(command, input=text.encode("utf-8"), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise LocalchatError(f"{command[0]} did not finish within {TIMEOUT_S:.0f}s (stopped); nothing was "
                                 "copied") from None
        except OSError as exc:
            raise LocalchatError(f"{command[0]} failed: {exc.strerror or exc}") from None
        if done.returncode != 0:
            raise LocalchatError(f"{command[0]} failed (exit {done.returncode}): is a display available?")
        return command[0]
    names = ", ".join(c[0] for c in candidates)
    raise LocalchatError(f"no clipboard tool found (tried {names}); nothing was copied")
