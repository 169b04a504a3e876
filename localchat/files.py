"""Files the user names, read safely; files we write, written whole or not at all.

Reading: only a regular file, and only up to a limit: a FIFO would block forever and a device such
as ``/dev/zero`` would never end. Writing: a temporary file beside the target, synced, then renamed
over it, so a full disk, a read-only directory or an interruption leaves the previous file (or
none) in place, never half of one, and no temporary file behind.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from localchat.errors import LocalchatError, UsageError

MAX_SETTINGS_BYTES = 16 * 1024**2  # a schema, a host file, an MCP or YAML file: far past any real one


def read_regular(path: Path, limit: int = MAX_SETTINGS_BYTES) -> bytes:
    """The first ``limit + 1`` bytes of a regular file (one more than ``limit`` says it is longer).
    ``OSError`` for anything else, whose ``strerror`` says why in a few words (``a directory, not
    a file``, ``a pipe or a device, not a file``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO's open never waits for a writer)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "a directory, not a file", str(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "a pipe or a device, not a file", str(path))
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_named(path_text: str, limit: int, where: str, shown: Callable[[str], str] = str) -> tuple[Path, bytes]:
    """A file the user named (``/load``, ``--image``), read as ``read_regular`` reads it; each
    failure one ``UsageError`` line starting with ``where`` (``shown`` writes the name)."""
    if "\0" in path_text:
        raise UsageError(f"{where}: a file name cannot hold a NUL character")
    try:
        path = Path(path_text).expanduser()
    except RuntimeError:  # ~someone who is not a user here
        raise UsageError(f"{where}: cannot find the home directory in {shown(path_text)}") from None
    try:
        return path, read_regular(path, limit)
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file: {shown(path_text)}") from None
    except OSError as exc:
        if exc.errno in (errno.EISDIR, errno.EINVAL):
            raise UsageError(f"{where}: {shown(path_text)} is not a regular file") from None
        raise UsageError(f"{where}: cannot read {shown(path_text)}: {exc.strerror}") from None


def read_text(path: Path, limit: int = MAX_SETTINGS_BYTES) -> str:
    """A regular file of at most ``limit`` bytes, as UTF-8 (a byte-order mark, which Windows editors
    write, dropped): ``OSError`` as ``read_regular`` says or ``larger than 16,777,216 bytes``;
    ``UnicodeDecodeError`` (a ``ValueError``)."""
    data = read_regular(path, limit)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit:,} bytes", str(path))
    return data.decode("utf-8-sig")


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically (``OSError`` on failure, nothing left behind)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_outputs(out: Path, texts: dict[str, str]) -> list[Path]:
    """Report files (``results.json``, ``summary.md`` …) in ``out``, each whole or not at all; a
    failure is one line saying which file was not written."""
    written: list[Path] = []
    for name, text in texts.items():
        path = out / name
        try:
            out.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text.encode("utf-8"))
        except OSError as exc:
            done = f" ({', '.join(p.name for p in written)} written)" if written else ""
            raise LocalchatError(f"cannot write {path}: {exc.strerror or exc}{done}") from None
        written.append(path)
    return written


def private_dirs(path: Path) -> Path:
    """``path`` and every missing directory above it, created owner-only (0700) whatever the umask
    (``mkdir -p`` gives the parents the umask's mode, so whichever file came first decided)."""
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(directory, 0o700)
    return path


def read_json_setting(path: Path, flag: str) -> object:
    """A JSON settings file the user names with ``flag`` (``--mcp``, ``--hostfile``…), parsed
    (nesting bounded); anything wrong is one usage line naming the flag and the file."""
    from localchat import bounded_json

    try:
        return bounded_json.loads(read_text(path))
    except FileNotFoundError:
        raise UsageError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{flag} {path}: a directory, not a file") from None
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{flag} {path}: not UTF-8 text (byte {exc.start})") from None
    except ValueError as exc:
        raise UsageError(f"{flag} {path}: not JSON ({exc})") from None
