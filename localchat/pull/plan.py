"""What a pull would do, found before a byte of weights moves: the repo's files and sizes (the
Hub's model info), which are already in the Hugging Face cache, the free disk, and whether the
model fits this machine (its config and safetensors headers, read with ranged requests)."""

from __future__ import annotations

import fnmatch
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from localchat.errors import LocalchatError, UsageError
from localchat.fit.verdict import FitReport

MAX_FILES = 2000  # a model is a few dozen files; a listing of more is not one
MAX_FILE_BYTES = 10**15  # a petabyte: past any file a Hub holds


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    sha256: str | None  # the LFS files' digest, checked after the download
    cached: bool


@dataclass(frozen=True)
class PullPlan:
    repo: str
    revision: str  # the commit every file is fetched at
    files: tuple[RemoteFile, ...]
    cache_dir: Path
    free_disk: int
    fit: FitReport | None

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def to_fetch(self) -> int:
        return sum(f.size for f in self.files if not f.cached)


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_error(repo: str, exc: Exception) -> LocalchatError:
    """The client's exceptions as one line each."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, GatedRepoError):
        return LocalchatError(f"{repo} is gated: accept its licence on the Hub, then log in "
                              "(uv run hf auth login, or set HF_TOKEN) and pull again")
    if isinstance(exc, RepositoryNotFoundError):
        return LocalchatError(f"{repo}: no such model repo on {endpoint()} (or it is private: log in first)")
    if isinstance(exc, RevisionNotFoundError):
        return LocalchatError(f"{repo}: that revision does not exist on {endpoint()}")
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return LocalchatError(f"cannot reach the Hub at {endpoint()} for {repo}: {first}")


def _free_disk(path: Path) -> int:
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def _wanted(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def _inside_repo(name: object) -> bool:
    """A name the cache can hold under the repo's snapshot and a terminal can show: relative, no
    ``..``, no control characters."""
    if (
        not isinstance(name, str)
        or not name
        or "\\" in name
        or len(name) > 1024
        or re.search(r"[\x00-\x1f\x7f-\x9f]", name)
    ):
        return False
    path = PurePosixPath(name)
    return not path.is_absolute() and all(part not in ("", ".", "..") for part in name.split("/"))


def _checked(repo: str, sibling) -> RemoteFile:
    """One file of the listing, refused in one line when the Hub's answer is not a repo's."""
    name, size = sibling.rfilename, sibling.size if sibling.size is not None else 0
    if not _inside_repo(name):
        raise LocalchatError(f"{repo}: the Hub lists a file named {str(name)[:80]!r}, which is not a path inside "
                             "a repo; nothing fetched")
    if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
        raise LocalchatError(f"{repo}: the Hub gives {name[:80]!r} the size {str(size)[:40]!r}, not a number of "
                             "bytes; nothing fetched")
    digest = sibling.lfs.sha256 if sibling.lfs is not None else None
    if digest is not None and not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        raise LocalchatError(f"{repo}: the Hub gives {name[:80]!r} a checksum that is not a sha256; nothing fetched")
    return RemoteFile(name=name, size=size, sha256=digest, cached=False)


def _listing(api, repo: str) -> tuple[str, list[RemoteFile]]:
    """The repo's commit and every file the Hub lists, each checked (nothing is filtered yet)."""
    from huggingface_hub import constants

    try:  # the client sets no timeout here: a Hub that never answers would hang the pull
        info = api.model_info(repo, files_metadata=True, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT)
    except Exception as exc:  # every client error is one line, named by hub_error
        raise hub_error(repo, exc) from None
    siblings = info.siblings or []
    if len(siblings) > MAX_FILES or not isinstance(info.sha, str) or not re.fullmatch(r"[0-9a-f]{40}", info.sha):
        raise LocalchatError(f"{repo}: the Hub's listing is not a model's ({len(siblings)} files, "
                             f"commit {str(info.sha)[:60]!r}); nothing fetched")
    return info.sha, [_checked(repo, sibling) for sibling in siblings]


def _files(repo: str, revision: str, listed: list[RemoteFile], patterns: tuple[str, ...]) -> list[RemoteFile]:
    """The files mlx_lm's own download takes (``patterns``), each marked when the cache has it."""
    from huggingface_hub import try_to_load_from_cache

    files = [replace(f, cached=isinstance(try_to_load_from_cache(repo, f.name, revision=revision), str))
             for f in listed if _wanted(f.name, patterns)]
    if not any(f.name.endswith(".safetensors") for f in files):
        raise LocalchatError(f"{repo} has no safetensors weights: not an MLX model "
                             "(a GGUF file goes through localchat import)")
    return files


def _remote_config(api, repo: str, revision: str) -> dict:
    """config.json from the cache when an earlier pull fetched it, else read over HTTP, not into
    the cache (nothing is kept for a model refused)."""
    from huggingface_hub import hf_hub_url, try_to_load_from_cache
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    from localchat import bounded_json
    from localchat.registry import read_config

    cached = try_to_load_from_cache(repo, "config.json", revision=revision)
    if isinstance(cached, str):
        return read_config(Path(cached).parent)
    url = hf_hub_url(repo, "config.json", revision=revision, endpoint=api.endpoint)
    try:
        response = get_session().get(url, headers=build_hf_headers(), timeout=30)
        hf_raise_for_status(response)
        config = bounded_json.loads(response.text)
    except Exception as exc:  # a missing or unreadable config: the fit cannot be judged
        raise LocalchatError(f"{repo}: cannot read its config.json ({exc})".splitlines()[0]) from None
    return config if isinstance(config, dict) else {}


def remote_shape(api, repo: str, revision: str, files: list[RemoteFile]):
    """The shape from the config and each weights file's header, read with ranged requests (not
    the client's ``get_safetensors_metadata``, which caches a sharded repo's index and draws a bar)."""
    from localchat.fit.shape import shape_from, tensors_of

    headers = {}
    for file in files:
        if file.name.endswith(".safetensors"):
            try:
                headers[file.name] = api.parse_safetensors_file_metadata(repo, file.name, revision=revision)
            except Exception as exc:  # unparsable headers: one line
                raise LocalchatError(f"{repo}: cannot read the safetensors header of {file.name} "
                                     f"({exc})".splitlines()[0]) from None
    return shape_from(_remote_config(api, repo, revision), tensors_of(headers))


def hub_deadline_s() -> float:
    """The whole of a plan's questions to the Hub, however slowly it answers: six of the client's
    per-read timeouts (60 s by default), so a Hub that trickles a byte at a time cannot hold a pull."""
    from huggingface_hub import constants

    return 6 * float(constants.HF_HUB_DOWNLOAD_TIMEOUT)


def _within(deadline: float, what: str, work: Callable[[], Any]) -> Any:
    """``work()`` in a daemon thread, given up at ``deadline`` (``time.monotonic``; the thread ends
    with the process)."""
    outcome: queue.Queue = queue.Queue()

    def run() -> None:
        try:
            outcome.put((True, work()))
        except BaseException as exc:  # handed to the caller's thread as it is
            outcome.put((False, exc))

    threading.Thread(target=run, name="hub-questions", daemon=True).start()
    try:
        ok, value = outcome.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        raise LocalchatError(f"{what}: the Hub at {endpoint()} did not finish answering within "
                             f"{hub_deadline_s():.0f} s (HF_HUB_DOWNLOAD_TIMEOUT sets a sixth of this)") from None
    if not ok:
        raise value
    return value


# the files mlx_lm's own download takes (``mlx_lm.utils.DEFAULT_ALLOW_PATTERNS``), written out:
# importing mlx_lm.utils imports transformers, ~0.9 s of every pull (a test keeps the two equal)
MLX_LM_TAKES = ("*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model", "*.txt",
                "*.jsonl", "*.jinja")


def make_plan(repo: str, judge_fit) -> PullPlan:
    """``judge_fit(shape)`` gives the verdict for this machine and the user's settings. The Hub is
    asked in a thread, under one deadline; what runs MLX (the verdict) runs here in the main thread:
    MLX first started from another thread aborts the process at its exit ("terminate called
    without an active exception")."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise UsageError("HF_HUB_OFFLINE is set: a pull needs the Hub (unset it, or point HF_ENDPOINT at a mirror)")
    from huggingface_hub import HfApi, constants

    api = HfApi()
    deadline = time.monotonic() + hub_deadline_s()
    revision, listed = _within(deadline, repo, lambda: _listing(api, repo))
    files = _files(repo, revision, listed, MLX_LM_TAKES)
    shape = _within(deadline, repo, lambda: remote_shape(api, repo, revision, files))
    cache_dir = Path(constants.HF_HUB_CACHE)
    return PullPlan(repo=repo, revision=revision, files=tuple(files), cache_dir=cache_dir,
                    free_disk=_free_disk(cache_dir), fit=judge_fit(shape))
