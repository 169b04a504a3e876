"""Standard output that fails in one line: full (``> /dev/full``), closed (``>&-``), or unable to
encode the text (``PYTHONIOENCODING=ascii``). Every command prints through ``sys.stdout``, which
``main`` replaces with this guard; a reader that left (``| head``) stays a quiet exit 141."""

from __future__ import annotations

from typing import Any, TextIO

from localchat.errors import OutputError


class GuardedOutput:
    def __init__(self, stream: TextIO | None):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._guarded(lambda stream: stream.write(text))

    def flush(self) -> None:
        if self._stream is not None:
            self._guarded(lambda stream: stream.flush())

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"

    def __getattr__(self, name: str) -> Any:
        if self._stream is None:
            raise OutputError("standard output is closed: nothing can be printed")
        return getattr(self._stream, name)

    def _guarded(self, act):
        if self._stream is None:
            raise OutputError("standard output is closed: nothing can be printed")
        try:
            return act(self._stream)
        except BrokenPipeError:
            raise  # the reader left: main exits 141, quietly
        except UnicodeEncodeError as exc:
            raise OutputError(f"standard output ({self.encoding}) cannot encode {exc.object[exc.start:exc.end]!r}: "
                              "use a UTF-8 locale, or PYTHONIOENCODING=utf-8") from None
        except OSError as exc:
            raise OutputError(f"cannot write to standard output: {exc.strerror or exc}") from None
