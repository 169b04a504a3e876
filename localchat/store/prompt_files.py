"""The files of serve's disk tier of prompt caches: one directory per model identity (a
fingerprint of its weights and the KV settings), one file per cached prefix, named by the hash of
its token ids; a bound on all of them together, least recently used out first.

Everything here reads and writes files only (no mlx): the engine's tier (``serve.engine.prompt_disk``)
says what goes in a file; ``ps``, ``doctor``, ``rm`` and ``log rm --all`` read or clear them.
Directories are 0700, files 0600; a file is written under ``writing/`` and renamed into place, so a
kill mid-write leaves no file that loads (and the next start removes what it left). Nothing here
follows a symbolic link: a linked root or model directory is refused by what writes or removes, and
skipped by what counts, so no file outside the data directory is ever read, counted or removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from localchat.errors import LocalchatError
from localchat.files import private_dirs
from localchat.sizes import parse_size
from localchat.store.kv_files import SUFFIX, read_metadata

DIR_NAME = "prompt-cache"
TEMP_DIR = "writing"
HITS_FILE = "hits.json"
WEIGHTS_FILE = "weights.json"
DEFAULT_MAX_BYTES = 10 * 10**9
MIN_TOKENS = 256  # a shorter prefix prefills in well under a second: not worth a file
FORMAT = "localchat-prompt-2"  # (2: a digest of the tensors in the metadata)
CACHE_DIR_ENV = "LOCALCHAT_PROMPT_CACHE_DIR"
CACHE_DISK_ENV = "LOCALCHAT_PROMPT_CACHE_DISK"


@dataclass(frozen=True)
class Stored:
    """A prefix on disk: its file, token ids, size and when it was last used."""

    path: Path
    tokens: tuple[int, ...]
    size: int
    used: float


def real_dir(path: Path) -> bool:
    """A directory of its own: not a link (to anywhere), not a file."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def regular_files(directory: Path, pattern: str) -> list[tuple[Path, os.stat_result]]:
    """The regular files in ``directory`` matching ``pattern`` with their ``lstat``: links (dangling
    or not), FIFOs and directories are left out, and a file that goes while listed is skipped."""
    found = []
    for path in sorted(directory.glob(pattern)) if real_dir(directory) else []:
        with contextlib.suppress(OSError):
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                found.append((path, info))
    return found


def token_ids(text: str) -> tuple[int, ...]:
    """A file's token ids as its metadata holds them: a JSON list of non-negative ints, or
    ``ValueError``."""
    value = json.loads(text)
    if not isinstance(value, list) or not all(type(t) is int and 0 <= t < 2**32 for t in value):
        raise ValueError("its token ids are not a list of token ids")
    return tuple(value)


def hits_in(path: Path) -> int:
    """The count a ``hits.json`` holds, 0 for anything else (damaged, huge, a link, not a file)."""
    from localchat.files import read_text

    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return 0
        value = json.loads(read_text(path, 4096)).get("hits", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return value if type(value) is int and 0 <= value < 2**53 else 0


def tokens_name(tokens: list[int] | tuple[int, ...]) -> str:
    return hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()[:40]


def identity(fingerprint: str, settings: dict[str, object]) -> str:
    """The directory of one model's caches: its weights' fingerprint and the KV settings."""
    text = json.dumps({"model": fingerprint, **settings}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def default_root() -> Path:
    from localchat.home import home_dir

    return home_dir() / DIR_NAME


def root_from_env() -> tuple[Path, int]:
    """The directory and the bound ``serve`` gave its engine; an engine started otherwise (``load
    --launch``, the tests' servers) has the bound 0: no disk tier."""
    root = os.environ.get(CACHE_DIR_ENV)
    return (Path(root) if root else default_root()), parse_size(os.environ.get(CACHE_DISK_ENV, "0"))


def engine_env(root: Path | None, bound: int) -> dict[str, str]:
    """What ``serve`` tells its engine children of the tier."""
    return {CACHE_DIR_ENV: str(root or default_root()), CACHE_DISK_ENV: f"{bound}B"}


@dataclass(frozen=True)
class PromptFiles:
    root: Path
    max_bytes: int = DEFAULT_MAX_BYTES

    def model_dir(self, key: str) -> Path:
        return self.root / key

    def check_root(self) -> None:
        """The root is a directory of its own or not there yet; a link in its place is refused (its
        target is somebody's folder: nothing there is ours to remove)."""
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISDIR(os.lstat(self.root).st_mode):
                raise LocalchatError(f"{self.root} is a link or a file, not serve's prompt-cache directory: "
                                     "nothing is removed through it (remove the link itself)")

    def model_dirs(self) -> list[Path]:
        """Each model's directory: real directories directly under a real root, links left out."""
        if not real_dir(self.root):
            return []
        return [p for p in sorted(self.root.iterdir()) if real_dir(p)]

    def prepare(self, key: str, weights: str) -> Path:
        """The model's directory and the one writes go through, owner-only, with the fingerprint of
        the weights it is for (``remove_model`` finds it by that); what a dead write left there is
        removed. A link or a file in their place is refused, never followed."""
        directory = self.model_dir(key)
        for path in (self.root, directory, directory / TEMP_DIR):
            with contextlib.suppress(FileNotFoundError):
                mode = os.lstat(path).st_mode
                if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
                    raise OSError(f"{path} is not a directory of its own (a link or a file): remove it")
        private_dirs(directory / TEMP_DIR)
        for path in (self.root, directory, directory / TEMP_DIR):
            os.chmod(path, 0o700)
        for left in (directory / TEMP_DIR).iterdir():
            with contextlib.suppress(OSError):
                left.unlink()
        self._write_json(directory / WEIGHTS_FILE, {"weights": weights})
        return directory

    def _write_json(self, path: Path, value: dict) -> None:
        temp = path.parent / TEMP_DIR / f"{path.name}.{os.getpid()}.{time.monotonic_ns()}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(temp, path)

    def stored(self, key: str) -> tuple[list[Stored], list[str]]:
        """The model's prefixes on disk, and a line for each file that cannot be one of them."""
        found, ignored = [], []
        directory = self.model_dir(key)
        for path in sorted(directory.glob(f"*{SUFFIX}")) if real_dir(directory) else []:
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode):
                    raise ValueError("it is not a regular file")
                meta = read_metadata(path)
                tokens = token_ids(str(meta.get("tokens", "[]")))
                if meta.get("format") != FORMAT or meta.get("identity") != key:
                    raise ValueError("it was written for another model or KV setting")
                if not tokens or tokens_name(tokens) != path.name[:-len(SUFFIX)]:
                    raise ValueError("its token ids do not match its name")
            except (OSError, ValueError, TypeError) as exc:
                ignored.append(f"{path.name}: {exc}")
                continue
            found.append(Stored(path=path, tokens=tokens, size=info.st_size, used=info.st_mtime))
        return found, ignored

    def temp_path(self, key: str, name: str) -> Path:
        return self.model_dir(key) / TEMP_DIR / f"{name}.{os.getpid()}.{time.monotonic_ns()}{SUFFIX}"

    def place(self, temp: Path, key: str, name: str) -> Path:
        """A whole file renamed into place (atomic on one file system), 0600."""
        os.chmod(temp, 0o600)
        final = self.model_dir(key) / f"{name}{SUFFIX}"
        os.replace(temp, final)
        return final

    def touch(self, path: Path) -> None:
        """A file just used: the last to go."""
        with contextlib.suppress(OSError):
            os.utime(path)

    def evict(self, keep: Path | None = None) -> list[Path]:
        """The least recently used files, every model's, removed until the total is within the bound
        (``keep``, the one just written, last). Returns what was removed."""
        entries = [(path == keep, info.st_mtime, info.st_size, path)
                   for directory in self.model_dirs() for path, info in regular_files(directory, f"*{SUFFIX}")]
        total, removed = sum(e[2] for e in entries), []
        for _, _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
            total -= size
        return removed

    def total_bytes(self) -> int:
        return sum(info.st_size for d in self.model_dirs() for _, info in regular_files(d, f"*{SUFFIX}"))

    def file_count(self) -> int:
        return sum(len(regular_files(d, f"*{SUFFIX}")) for d in self.model_dirs())

    def hits(self) -> int:
        """Prefixes served from disk, every model's, since the files were made."""
        return sum(hits_in(d / HITS_FILE) for d in self.model_dirs())

    def count_hit(self, key: str) -> None:
        with contextlib.suppress(OSError):
            self._write_json(self.model_dir(key) / HITS_FILE, {"hits": hits_in(self.model_dir(key) / HITS_FILE) + 1})

    def remove_models(self, keys: list[str]) -> int:
        """Every cache of these model identities; the bytes freed. A linked root is refused; a linked
        model directory is left alone (``rmtree`` itself never follows a link below it)."""
        self.check_root()
        freed = 0
        for key in keys:
            directory = self.model_dir(key)
            if real_dir(directory):
                walked = (regular_files(Path(sub), "*") for sub, _, _ in os.walk(directory))
                freed += sum(info.st_size for files in walked for _, info in files)
                shutil.rmtree(directory, ignore_errors=True)
        return freed

    def remove_model(self, weights: str) -> int:
        """Every cache of the model whose weights have this fingerprint, whatever its KV settings."""
        from localchat.files import read_text

        self.check_root()
        keys = []
        for directory in self.model_dirs():
            with contextlib.suppress(OSError, ValueError, AttributeError):
                if regular_files(directory, WEIGHTS_FILE) and \
                        json.loads(read_text(directory / WEIGHTS_FILE, 4096)).get("weights") == weights:
                    keys.append(directory.name)
        return self.remove_models(keys)

    def remove_all(self) -> int:
        self.check_root()
        return self.remove_models([p.name for p in self.model_dirs()])
