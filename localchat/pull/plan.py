"""What a pull would do, found before a byte of weights moves: the repo's files and sizes (the
Hub's model info), which are already in the Hugging Face cache, the free disk, and whether the
model fits this machine (its config and safetensors headers, read with ranged requests)."""

from __future__ import annotations

import fnmatch
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from localchat.errors import LocalchatError, UsageError
from localchat.fit.verdict import FitReport

# the files mlx_lm's own download takes (mlx_lm.utils._download's allow_patterns)
MODEL_FILES = ("*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model",
               "*.txt", "*.jsonl", "*.jinja")
MAX_FILES = 2000  # a model is a few dozen files; a listing of more is not one


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


def _wanted(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in MODEL_FILES)


def _files(api, repo: str) -> tuple[str, list[RemoteFile]]:
    from huggingface_hub import constants, try_to_load_from_cache

    try:  # the client sets no timeout here: a Hub that never answers would hang the pull
        info = api.model_info(repo, files_metadata=True, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT)
    except Exception as exc:  # every client error is one line, named by hub_error
        raise hub_error(repo, exc) from None
    if len(info.siblings or []) > MAX_FILES or not isinstance(info.sha, str):
        raise LocalchatError(f"{repo}: the Hub's listing is not a model's ({len(info.siblings or [])} files, "
                             f"commit {info.sha!r}); nothing fetched")
    files = []
    for sibling in info.siblings or []:
        if not _wanted(sibling.rfilename):
            continue
        cached = isinstance(try_to_load_from_cache(repo, sibling.rfilename, revision=info.sha), str)
        lfs = sibling.lfs
        files.append(RemoteFile(name=sibling.rfilename, size=int(sibling.size or 0),
                                sha256=lfs.sha256 if lfs is not None else None, cached=cached))
    if not any(f.name.endswith(".safetensors") for f in files):
        raise LocalchatError(f"{repo} has no safetensors weights: not an MLX model "
                             "(a GGUF file goes through localchat import)")
    return info.sha, files


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


def remote_shape(api, repo: str, revision: str):
    from localchat.fit.shape import shape_from, tensors_of

    try:
        metadata = api.get_safetensors_metadata(repo, revision=revision)
    except Exception as exc:  # unparsable headers: one line
        raise LocalchatError(f"{repo}: cannot read its safetensors headers ({exc})".splitlines()[0]) from None
    return shape_from(_remote_config(api, repo, revision), tensors_of(metadata))


def make_plan(repo: str, judge_fit) -> PullPlan:
    """``judge_fit(shape)`` gives the verdict for this machine and the user's settings."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise UsageError("HF_HUB_OFFLINE is set: a pull needs the Hub (unset it, or point HF_ENDPOINT at a mirror)")
    from huggingface_hub import HfApi, constants

    api = HfApi()
    revision, files = _files(api, repo)
    cache_dir = Path(constants.HF_HUB_CACHE)
    return PullPlan(repo=repo, revision=revision, files=tuple(files), cache_dir=cache_dir,
                    free_disk=_free_disk(cache_dir), fit=judge_fit(remote_shape(api, repo, revision)))
