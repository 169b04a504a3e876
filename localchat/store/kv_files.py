"""Saved sessions' KV caches on disk: one file per saved session, a total cap, oldest out first.

The files live in ``kv-cache/`` in the user's data directory (mode 0700, files 0600), named after
the saved session. What a file holds and when it may be used is ``backends.saved_cache``'s
business; here is only where files go, how big they are and which go first when the total passes
the cap (``--cache-max-bytes`` or ``cache_max_bytes`` in config.yaml). Reading a file's metadata
needs no mlx: a safetensors file starts with the length of its JSON header.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from localchat import bounded_json
from localchat.errors import LocalchatError, UsageError
from localchat.files import private_dirs
from localchat.sizes import parse_size, shown_size

DIR_NAME = "kv-cache"
SUFFIX = ".safetensors"
TEMP_DIR = "writing"
DEFAULT_MAX_BYTES = 4 * 10**9
STALE_TEMP_S = 3600.0  # a temporary file this old was left by a write that died
MAX_HEADER_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class CacheFiles:
    """The directory of saved KV caches and its cap in bytes."""

    directory: Path
    max_bytes: int = DEFAULT_MAX_BYTES

    def path_for(self, name: str) -> Path:
        """A saved session's cache file (names were checked when saved; a damaged database's
        name that could leave the directory gets no file)."""
        if not name or any(c in name for c in "/\\\0") or name in (".", ".."):
            raise UsageError(f"invalid session name {name!r}")
        return self.directory / f"{name}{SUFFIX}"

    def temp_for(self, name: str) -> Path:
        """Where a cache is written before it is renamed into place (the same file system, so the
        rename is atomic); mlx insists on the suffix."""
        return self.directory / TEMP_DIR / f"{name}.{os.getpid()}.{time.monotonic_ns()}{SUFFIX}"

    def prepare(self) -> None:
        """The directory and its temporary one, made owner-only; never through a link."""
        self._check_directories()
        private_dirs(self.directory / TEMP_DIR)
        self._check_directories()
        os.chmod(self.directory, 0o700)

    def _check_directories(self) -> None:
        """Each of the directory and its temporary one is a real directory, or not there yet: a
        link (to anywhere) or a file in their place is refused, never followed."""
        for path in (self.directory, self.directory / TEMP_DIR):
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                return
            except OSError as exc:
                raise LocalchatError(f"cannot use {path}: {exc.strerror}") from None
            if stat.S_ISLNK(mode):
                raise LocalchatError(f"{path} is a symbolic link: saved KV caches are never read or written "
                                     "through one (remove it)")
            if not stat.S_ISDIR(mode):
                raise LocalchatError(f"{path} is not a directory (remove it)")

    def existing(self, name: str) -> Path | None:
        """``name``'s cache file when there is one that may be read: a regular file (a link is
        never followed, a FIFO or device never opened) no larger than the cap; None when there is
        none; a LocalchatError saying why otherwise."""
        self._check_directories()
        path = self.path_for(name)
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise LocalchatError(f"cannot use {path}: {exc.strerror}") from None
        if stat.S_ISLNK(info.st_mode):
            raise LocalchatError(f"{path} is a symbolic link (never followed)")
        if not stat.S_ISREG(info.st_mode):
            raise LocalchatError(f"{path} is not a regular file")
        if info.st_size > self.max_bytes:
            raise LocalchatError(f"at {shown_size(info.st_size)} it is over the cap of {shown_size(self.max_bytes)} "
                                 "(--cache-max-bytes)")
        return path

    def size_of(self, name: str) -> int | None:
        """The size of ``name``'s cache file (a regular file only; links are not followed)."""
        try:
            info = os.lstat(self.path_for(name))
        except (OSError, UsageError):
            return None
        return info.st_size if stat.S_ISREG(info.st_mode) else None

    def remove(self, name: str) -> int | None:
        """Remove ``name``'s cache; its size, or None when it had none."""
        self._check_directories()
        size = self.size_of(name)
        try:
            self.path_for(name).unlink()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise LocalchatError(f"cannot remove the KV cache {self.path_for(name)}: {exc.strerror}") from None
        return size

    def names(self) -> list[str]:
        """Every cache kept here, by name."""
        return sorted(p.name[:-len(SUFFIX)] for p in self.directory.glob(f"*{SUFFIX}")) \
            if self.directory.is_dir() else []

    def evict(self, keep: str) -> list[str]:
        """Remove the oldest caches (by last write) until the total fits the cap; ``keep`` (the
        one just written) goes last, and only when it alone is over the cap. Returns the names
        removed. Temporary files a dead write left behind go first."""
        for path in (self.directory / TEMP_DIR).glob(f"*{SUFFIX}"):
            with contextlib.suppress(OSError):
                if time.time() - path.stat().st_mtime > STALE_TEMP_S:
                    path.unlink()
        entries = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                info = path.lstat()
            except OSError:
                continue
            entries.append((path.name != f"{keep}{SUFFIX}", info.st_mtime, info.st_size, path))
        total = sum(size for _, _, size, _ in entries)
        removed = []
        for _, _, size, path in sorted(entries, key=lambda e: (not e[0], e[1])):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            removed.append(path.name[:-len(SUFFIX)])
        return removed


def read_metadata(path: Path) -> dict[str, str]:
    """The metadata given to mlx_lm's ``save_prompt_cache``, read without loading any tensor
    (mlx_lm stores ``[metadata, classes, scalars]`` flattened: its keys start with ``0.``);
    ValueError when the file is not such a file (truncated, damaged, something else)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("it is not a regular file")
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("the file is shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES:
            raise ValueError("its header length is implausible")
        raw = f.read(length)
    if len(raw) < length:
        raise ValueError("the file ends inside its header")
    try:
        header = bounded_json.loads(raw)
    except ValueError:  # not UTF-8, not JSON, or nested past any header's depth
        raise ValueError("its header is not JSON") from None
    stored = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(stored, dict) or not all(isinstance(v, str) for v in stored.values()):
        raise ValueError("it has no metadata")
    return {key[2:]: value for key, value in stored.items() if key.startswith("0.")}


def cache_files(max_bytes: int | None = None) -> CacheFiles:
    """The user's cache directory with the cap from the flag, else config.yaml, else the default."""
    from localchat.home import home_dir, load_config

    if max_bytes is None:
        configured = load_config().get("cache_max_bytes")
        max_bytes = parse_size(configured, "cache_max_bytes") if configured is not None else DEFAULT_MAX_BYTES
    return CacheFiles(home_dir() / DIR_NAME, max_bytes)
