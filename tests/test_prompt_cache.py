"""serve's prompt caches on disk: a long prompt prefilled once survives a restart of serve (the same
greedy answer, its tokens reported cached), a longer prompt reuses the prefix, another model or
other KV settings never read it, the bound removes the oldest, 0 keeps nothing, and damaged,
foreign or half-written files are ignored with a line in the engine's log. Real engines (demo,
SmolLM2), each started by the test through ``localchat serve``."""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from routed import Serve

WORDS = "the a sea boat wind harbor code red blue green small large river stone".split()
WORDS_IN_WINDOW = 230  # ~660 demo tokens (~2 MB on disk): with 80 more words, still within its window of 1,024


def long_text(words: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def ask(serve: Serve, text: str, model: str = "demo", **extra) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": text + " Reply only OK."}],
            "max_tokens": 8, "temperature": 0, **extra}
    reply = httpx.post(serve.url + "/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def engine_log(home: Path, serve: Serve) -> str:
    return (home / "logs" / f"server-{serve.port}.log").read_text()


def files_of(home: Path) -> list[Path]:
    return sorted((home / "prompt-cache").glob("*/*.safetensors"))


def wait_files(home: Path, n: int = 1, settle: float = 1.5) -> list[Path]:
    """The files once there are ``n`` and none has come or gone for ``settle`` seconds (a reply's
    segments are offered one after another: a longer prefix supersedes a shorter one)."""
    import time

    deadline = time.monotonic() + 30
    while len(files_of(home)) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    seen, still_since = files_of(home), time.monotonic()
    while time.monotonic() - still_since < settle and time.monotonic() < deadline:
        time.sleep(0.1)
        now = files_of(home)
        if now != seen:
            seen, still_since = now, time.monotonic()
    return seen


def prefilled(home: Path, text: str, *args: str, model: str = "demo", **extra) -> dict:
    """``text`` asked of a serve started and stopped for it, once its cache is on disk: the reply."""
    serve = Serve(home, "-m", model, *args)
    try:
        reply = ask(serve, text, model=model, **extra)
        wait_files(home)
    finally:
        serve.stop()
    return reply


def test_a_prompt_prefilled_once_is_served_from_disk_after_a_restart(tmp_path):
    home, text = tmp_path / "home", long_text(WORDS_IN_WINDOW)
    first = Serve(home, "-m", "demo")
    try:
        cold = ask(first, text)
        assert cached(cold) < 16
        wait_files(home)
    finally:
        first.stop()
    written = files_of(home)  # (as the stopped engine left them)
    assert len(written) == 1
    assert oct(written[0].stat().st_mode & 0o777) == "0o600"
    for directory in (home / "prompt-cache", written[0].parent, written[0].parent / "writing"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    again = Serve(home, "-m", "demo")
    try:
        warm = ask(again, text)
        assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
        assert cached(warm) >= cold["usage"]["prompt_tokens"] - 2  # all but the last token or two
        assert "tokens from disk" in engine_log(home, again)
        longer = ask(again, text + " " + long_text(80, seed=2))
        assert cached(longer) >= cached(warm) - 8  # the shared prefix, from memory or disk; only the rest prefilled
        held = httpx.get(again.url + "/localchat/ps", timeout=10).json()["prompt_cache"]
        assert held["bytes"] > 0 and held["hits"] >= 1
        shown = subprocess.run([sys.executable, "-m", "localchat", "ps", "--base-url", again.url + "/v1"],
                               capture_output=True, text=True, timeout=60, env=os.environ | {"COLUMNS": "200"})
        assert "prompt caches on disk" in shown.stdout and "served from disk" in shown.stdout
    finally:
        again.stop()


def test_other_kv_bits_never_read_them_and_0_keeps_none(tmp_path):
    home, text = tmp_path / "home", long_text(WORDS_IN_WINDOW)
    prefilled(home, text)
    other = Serve(home, "-m", "demo", "--kv-bits", "8")  # (another model: the next test)
    try:
        assert cached(ask(other, text)) < 16
        assert "tokens from disk" not in engine_log(home, other)
    finally:
        other.stop()
    off_home = tmp_path / "off"
    off = Serve(off_home, "-m", "demo", "--prompt-cache-disk", "0")
    try:
        ask(off, text)
        ask(off, text)
    finally:
        off.stop()
    assert files_of(off_home) == []


def test_the_bound_removes_the_least_recently_used_first(tmp_path):
    home = tmp_path / "home"
    serve = Serve(home, "-m", "demo", "--prompt-cache-disk", "3MB")  # one ~660-token prefix of the demo (2 MB)
    try:
        ask(serve, long_text(WORDS_IN_WINDOW, seed=1))
        first = wait_files(home)
        ask(serve, long_text(WORDS_IN_WINDOW, seed=3))
        import time

        deadline = time.monotonic() + 30
        while files_of(home) == first and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        serve.stop()
    left = files_of(home)
    assert len(left) == 1 and left != first  # the older one went
    assert "older files removed to stay within the bound" in engine_log(home, serve)


def test_an_idle_unload_keeps_the_prefix_and_models_share_the_bound(tmp_path):
    home, text = tmp_path / "home", long_text(WORDS_IN_WINDOW)
    serve = Serve(home, "-m", "demo", "-m", "demo-notes", "--keep-alive", "1s", "--prompt-cache-disk", "5MB")
    try:
        cold = ask(serve, text)
        wait_files(home)
        serve.wait_log("unloaded demo after")
        again = ask(serve, text)  # loaded again: its prefix from disk
        assert cached(again) >= cold["usage"]["prompt_tokens"] - 2
        assert again["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
        assert cached(ask(serve, text, model="demo-notes")) < 16  # another model never reads demo's files
        ask(serve, long_text(WORDS_IN_WINDOW, seed=5))
        import time

        deadline = time.monotonic() + 30
        while len({p.parent for p in files_of(home)}) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
    finally:
        serve.stop()
    left = files_of(home)
    assert len({p.parent for p in left}) == 2  # both models' caches, in one root
    assert sum(p.stat().st_size for p in left) <= 5 * 10**6  # under the one bound: the oldest went


def test_damaged_foreign_and_half_written_files_are_ignored(tmp_path):
    home, text = tmp_path / "home", long_text(WORDS_IN_WINDOW)
    first = Serve(home, "-m", "demo")
    try:
        expected = ask(first, text)["choices"][0]["message"]["content"]
        good = wait_files(home)[0]
    finally:
        first.stop()
    directory = good.parent
    (directory / "writing" / "left-by-a-kill.safetensors").write_bytes(good.read_bytes()[:1000])  # kill -9 mid-write
    original = good.read_bytes()
    good.write_bytes(original[: len(original) // 2])  # truncated in place
    serve = Serve(home, "-m", "demo")
    try:
        reply = ask(serve, text)
        assert reply["choices"][0]["message"]["content"] == expected and cached(reply) < 16
        assert "ignored" in engine_log(home, serve)
    finally:
        serve.stop()
    assert not (directory / "writing" / "left-by-a-kill.safetensors").exists()  # removed at the start
    notes_home = tmp_path / "notes"
    notes = Serve(notes_home, "-m", "demo-notes")
    try:
        ask(notes, text, model="demo-notes")
        foreign = wait_files(notes_home)[0]
    finally:
        notes.stop()
    for old in files_of(home):
        old.unlink()
    (directory / good.name).write_bytes(foreign.read_bytes())  # another model's file, renamed into place
    serve = Serve(home, "-m", "demo")
    try:
        reply = ask(serve, text)
        assert reply["choices"][0]["message"]["content"] == expected and cached(reply) < 16
        assert "written for another model" in engine_log(home, serve) or "do not match" in engine_log(home, serve)
    finally:
        serve.stop()


def test_log_rm_all_clears_them(tmp_path):
    home = tmp_path / "home"
    prefilled(home, long_text(WORDS_IN_WINDOW))
    assert files_of(home)
    done = subprocess.run([sys.executable, "-m", "localchat", "log", "rm", "--all", "--yes"], capture_output=True,
                          text=True, timeout=60, env=os.environ | {"LOCALCHAT_HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert files_of(home) == [] and "prompt caches" in done.stdout + done.stderr  # (localchat rm: test_pull)


@pytest.mark.parametrize("words", [240])
def test_smollm2_answers_the_same_from_disk_after_a_restart(tmp_path, smollm2, words):
    home, text = tmp_path / "home", long_text(words)
    # (275 tokens, just over the disk tier's 256, prefilled at ~10 tok/s here: the answer's few tokens suffice)
    cold = prefilled(home, text, model=str(smollm2), max_tokens=6)
    again = Serve(home, "-m", str(smollm2))
    try:
        warm = ask(again, text, model=str(smollm2), max_tokens=6)
    finally:
        again.stop()
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    assert cached(warm) >= cold["usage"]["prompt_tokens"] - 2 and json.dumps(warm)
