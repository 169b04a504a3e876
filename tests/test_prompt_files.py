"""serve's disk tier of prompt caches against planted files and links, as units (no engine): nothing
that removes or counts follows a link out of the data directory, a linked root is refused by every
remover (``rm``, ``log rm --all``), damaged metadata and counters are ignored, not fatal, and a file
whose tensors were changed under an intact header is never served."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from localchat.errors import LocalchatError
from localchat.store.prompt_files import HITS_FILE, SUFFIX, TEMP_DIR, PromptFiles, tokens_name


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A user's folder outside the data directory, with what a remover must never touch."""
    folder = tmp_path / "users-folder"
    (folder / "projects").mkdir(parents=True)
    (folder / "projects" / "notes.txt").write_text("mine")
    (folder / "photos.safetensors").write_bytes(b"x" * 4096)
    (folder / "inner").mkdir()
    (folder / "inner" / "weights.safetensors").write_bytes(b"y" * 4096)
    return folder


def untouched(folder: Path) -> bool:
    return (folder / "projects" / "notes.txt").read_text() == "mine" and (folder / "photos.safetensors").exists() \
        and (folder / "inner" / "weights.safetensors").exists()


def test_a_linked_root_is_refused_by_every_remover(tmp_path, outside):
    root = tmp_path / "home" / "prompt-cache"
    root.parent.mkdir()
    root.symlink_to(outside)
    files = PromptFiles(root, 1)
    for remove in (files.remove_all, lambda: files.remove_model("abc"), lambda: files.remove_models(["inner"])):
        with pytest.raises(LocalchatError, match="link"):
            remove()
    assert files.evict() == [] and files.total_bytes() == 0 and files.hits() == 0
    assert untouched(outside)


def test_log_rm_all_refuses_a_linked_prompt_cache_and_removes_nothing(tmp_path, outside):
    home = tmp_path / "home"
    home.mkdir()
    (home / "prompt-cache").symlink_to(outside)
    done = subprocess.run([sys.executable, "-m", "localchat", "log", "rm", "--all", "--yes"], capture_output=True,
                          text=True, timeout=60, env=os.environ | {"LOCALCHAT_HOME": str(home)})
    assert done.returncode == 1 and "link" in done.stderr and "Traceback" not in done.stderr
    assert untouched(outside)


def test_eviction_and_counts_never_follow_a_linked_model_directory(tmp_path, outside):
    files = PromptFiles(tmp_path / "prompt-cache", 1)  # a 1-byte bound: everything of ours goes
    ours = files.prepare("k" * 32, "w")
    (ours / f"{tokens_name([1, 2])}{SUFFIX}").write_bytes(b"z" * 100)
    (files.root / "zz-evil").symlink_to(outside)
    (ours / f"dangling{SUFFIX}").symlink_to(tmp_path / "nowhere")
    removed = files.evict()
    assert [p.parent for p in removed] == [ours] and untouched(outside)
    assert files.total_bytes() == 0 and files.file_count() == 0
    files.remove_all()
    assert untouched(outside) and (files.root / "zz-evil").is_symlink() and not ours.exists()


def test_hit_counts_past_any_number_or_linked_are_zero(tmp_path):
    files = PromptFiles(tmp_path / "prompt-cache")
    one, two = files.prepare("a" * 32, "w"), files.prepare("b" * 32, "w")
    (one / HITS_FILE).write_text('{"hits": 1e400}')
    (two / HITS_FILE).write_text('{"hits": 3}')
    (files.prepare("c" * 32, "w") / HITS_FILE).symlink_to(tmp_path / "nowhere")
    assert files.hits() == 3
    files.count_hit("a" * 32)
    assert json.loads((one / HITS_FILE).read_text()) == {"hits": 1}


def test_a_file_whose_token_ids_are_not_ids_is_ignored_not_fatal(tmp_path):
    from localchat.store import kv_files

    files = PromptFiles(tmp_path / "prompt-cache")
    directory = files.prepare("d" * 32, "w")
    header = {"__metadata__": {"0.format": "localchat-prompt-2", "0.identity": "d" * 32, "0.tokens": "[[1], [2]]"}}
    raw = json.dumps(header).encode()
    (directory / f"{tokens_name([[1], [2]])}{SUFFIX}").write_bytes(len(raw).to_bytes(8, "little") + raw)
    found, ignored = files.stored("d" * 32)
    assert found == [] and len(ignored) == 1 and "token ids" in ignored[0]
    assert kv_files.SUFFIX == SUFFIX


def test_writing_is_made_owner_only_even_when_it_was_open(tmp_path):
    files = PromptFiles(tmp_path / "prompt-cache")
    directory = files.prepare("e" * 32, "w")
    os.chmod(directory / TEMP_DIR, 0o777)
    files.prepare("e" * 32, "w")
    assert stat.S_IMODE(os.lstat(directory / TEMP_DIR).st_mode) == 0o700


def test_a_file_with_damaged_tensors_and_an_intact_header_is_not_served(tmp_path):
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from localchat.serve.engine.prompt_disk import DiskTier

    cache = KVCache()
    cache.update_and_fetch(mx.random.normal((1, 2, 300, 8)), mx.random.normal((1, 2, 300, 8)))
    tokens = tuple(range(300))
    tier = DiskTier(PromptFiles(tmp_path / "prompt-cache"), {})
    tier.files.prepare("f" * 32, "w")
    tier._write("f" * 32, tokens, [cache])
    entry = tier.files.stored("f" * 32)[0][0]
    assert tier._load("f" * 32, entry, 299) is not None  # whole, it is read
    data = bytearray(entry.path.read_bytes())
    data[-5] ^= 0xFF  # one byte of the last tensor, the header as it was
    entry.path.write_bytes(bytes(data))
    tier._index["f" * 32] = {entry.tokens: entry}
    assert tier._load("f" * 32, entry, 299) is None
    assert tier._index["f" * 32] == {}
