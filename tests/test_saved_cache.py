"""Saved sessions keep their KV cache: the same tokens after a resume with or without it, one
line for every reason it is not used (a changed model, template or option, a damaged file), and
disk use that is private, capped and removed with the session."""

import json
import os
import stat
import struct

import pytest
from typer.testing import CliRunner

from localchat.backends import GenerationParams
from localchat.backends.inproc import InProcessBackend
from localchat.backends.mlx_options import RuntimeOptions
from localchat.backends.saved_cache import model_fingerprint
from localchat.cli.app import app
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.store.keeper import SessionSaver
from localchat.store.kv_files import CacheFiles, parse_size, read_metadata
from localchat.store.saved_sessions import SessionStore
from localchat.store.session_cache import SessionCaches, restore_cache
from tests.conftest import DEMO_DIR

SYSTEM = "You are a helpful assistant."
FACTS = ["My name is Ada.", "I live in Paris.", "My cat is called Tom."]
QUESTION = "What is my name?"
runner = CliRunner()


def backend_for(demo, options=None, fingerprint=None):
    model, tokenizer = demo
    return InProcessBackend(model, tokenizer, "demo", options=options,
                            fingerprint=model_fingerprint(DEMO_DIR) if fingerprint is None else fingerprint)


def chat(backend, turns=()):
    return ChatSession(backend, Conversation(SYSTEM, list(turns)), GenerationParams(max_tokens=24))


def saved_conversation(tmp_path, demo, options=None, name="s"):
    """A three-turn conversation saved with its cache; the live session, to continue in-process."""
    session = chat(backend_for(demo, options))
    for fact in FACTS:
        session.ask(fact)
    files = CacheFiles(tmp_path / "kv")
    saver = SessionSaver(SessionStore(tmp_path / "db.sqlite3"), "uid-1", "demo", caches=SessionCaches(files))
    written = saver.save(session, name)
    return session, files, written


def resumed(demo, session, files, options=None, uid="uid-1", name="s", fingerprint=None):
    again = chat(backend_for(demo, options, fingerprint), session.conversation.turns)
    return again, restore_cache(again, uid, name, files)


@pytest.mark.parametrize("options", [None, RuntimeOptions(kv_bits=8, kv_group_size=32, quantized_kv_start=0),
                                     RuntimeOptions(max_kv_size=512)], ids=["plain", "kv-bits-8", "rotating"])
def test_a_resumed_turn_prefills_only_the_new_message_and_answers_the_same_tokens(tmp_path, demo, options):
    session, files, written = saved_conversation(tmp_path, demo, options)
    assert written.cache and written.cache.size == files.size_of("s") and written.cache.tokens > 60
    again, line = resumed(demo, session, files, options)
    assert line.startswith(f"KV cache loaded: {written.cache.tokens} tokens"), line
    with_cache = again.ask(QUESTION)
    in_session = session.ask(QUESTION)  # the original session, its cache never left memory
    assert with_cache.stats.cached_tokens == written.cache.tokens
    assert with_cache.stats.prompt_tokens - with_cache.stats.cached_tokens < 20
    assert again.backend.cached_ids == session.backend.cached_ids
    if options is None:  # a plain cache: re-prefilling everything gives the same tokens too
        cold = chat(backend_for(demo), session.conversation.turns[:3])
        cold.ask(QUESTION)
        assert cold.backend.cached_ids == again.backend.cached_ids
        assert with_cache.text == in_session.text


@pytest.mark.parametrize("change, reason", [
    (dict(uid="uid-2"), "belongs to another conversation"),
    (dict(fingerprint="0" * 32), "model's files changed"),
    (dict(options=RuntimeOptions(kv_bits=4)), "KV cache options differ"),
    (dict(name="other"), "no saved KV cache"),
])
def test_a_cache_that_does_not_fit_is_one_line_and_the_turn_re_prefills(tmp_path, demo, change, reason):
    session, files, _ = saved_conversation(tmp_path, demo)
    again, line = resumed(demo, session, files, **change)
    assert reason in line and "prefills the whole prompt" in line
    assert again.ask(QUESTION).stats.cached_tokens == 0


def test_where_the_cache_and_the_prompt_part_is_said(tmp_path, demo):
    """Within the last reply (the demo answers "Yes, Good is .." with "." twice, and the text read back
    as history is "..": one token) is usual; before it, something changed (here the system message)."""
    session = chat(backend_for(demo))
    session.ask("Remember the code harbor 17.")
    files = CacheFiles(tmp_path / "kv")
    SessionSaver(SessionStore(tmp_path / "db.sqlite3"), "uid-1", "demo", caches=SessionCaches(files)).save(session, "s")
    _, line = resumed(demo, session, files)
    assert "but only" in line and "usual, nothing changed" in line, line
    terse = ChatSession(backend_for(demo), Conversation("You are terse.", list(session.conversation.turns)),
                        GenerationParams(max_tokens=24))
    line = restore_cache(terse, "uid-1", "s", files)
    assert "but only" in line and "the system message, the tools offered or the template changed" in line, line


def _rewrite_header(path, edit):
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    edit(header)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length:])


def _set_meta(key, value):
    return lambda h: h["__metadata__"].__setitem__(key, value)


DAMAGE = {
    "empty": lambda p: p.write_bytes(b""),
    "truncated header": lambda p: p.write_bytes(p.read_bytes()[:5]),
    "truncated tensors": lambda p: p.write_bytes(p.read_bytes()[:p.stat().st_size // 2]),
    "a flipped byte": lambda p: p.write_bytes(p.read_bytes()[:-100] + bytes([p.read_bytes()[-100] ^ 0x40])
                                              + p.read_bytes()[-99:]),
    "absurd header length": lambda p: p.write_bytes(struct.pack("<Q", 2**62) + p.read_bytes()[8:]),
    "header not JSON": lambda p: p.write_bytes(struct.pack("<Q", 4) + b"\xff{[x" + p.read_bytes()[12:]),
    "ids not a list": lambda p: _rewrite_header(p, _set_meta("0.ids", '{"a": 1}')),
    "ids one short": lambda p: _rewrite_header(p, _set_meta("0.ids", json.dumps(
        json.loads(read_metadata(p)["ids"])[:-1]))),
    "unknown cache class": lambda p: _rewrite_header(p, _set_meta("1.0", "Popen")),
    "other mlx": lambda p: _rewrite_header(p, _set_meta("0.mlx", "0.0.1")),
    "other template": lambda p: _rewrite_header(p, _set_meta("0.template", "x")),
    "other format": lambda p: _rewrite_header(p, _set_meta("0.format", "localchat-kv-0")),
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_cache_file_is_one_line_never_a_traceback(tmp_path, demo, damage):
    session, files, _ = saved_conversation(tmp_path, demo)
    damage(files.path_for("s"))
    again, line = resumed(demo, session, files)
    assert line.startswith("saved KV cache not used: ") and "\n" not in line, line
    result = again.ask(QUESTION)
    assert result.stats.cached_tokens == 0 and result.committed


def test_files_are_private_capped_oldest_first_and_a_failed_write_keeps_the_session(tmp_path, demo):
    session, files, written = saved_conversation(tmp_path, demo, name="old")
    assert stat.S_IMODE(files.path_for("old").stat().st_mode) == 0o600
    assert stat.S_IMODE(files.directory.stat().st_mode) == 0o700
    size = written.cache.size
    os.utime(files.path_for("old"), (1, 1))
    store = SessionStore(tmp_path / "db.sqlite3")
    capped = SessionCaches(CacheFiles(files.directory, max_bytes=int(size * 1.5)))
    second = SessionSaver(store, "uid-2", "demo", caches=capped).save(session, "new")
    assert second.cache.evicted == ("old",) and "evicted the oldest: old" in second.cache.describe()
    assert files.size_of("old") is None and files.size_of("new") == size
    too_small = SessionCaches(CacheFiles(files.directory, max_bytes=size // 2))
    third = SessionSaver(store, "uid-3", "demo", caches=too_small).save(session, "big")
    assert "over the cap" in third.cache.describe() and files.size_of("big") is None
    assert files.size_of("new") is None  # evicted on the way: the cap holds
    blocked = tmp_path / "file"
    blocked.write_text("x")
    failed = SessionSaver(store, "uid-4", "demo", caches=SessionCaches(CacheFiles(blocked / "kv"))).save(session, "x")
    assert failed.cache.problem and store.load("x").turns == tuple(session.conversation.turns)
    skipped = SessionSaver(store, "uid-5", "demo", caches=SessionCaches(files.__class__(files.directory), write=False))
    assert skipped.save(session, "plain").cache is None and files.size_of("plain") is None


@pytest.mark.parametrize("text, expected", [("4G", 4 * 10**9), ("500MB", 500 * 10**6), ("1.5GiB", 1610612736),
                                            ("0", 0), ("123B", 123)])
def test_sizes_parse(text, expected):
    assert parse_size(text) == expected


def test_save_resume_show_and_remove_from_the_command_line(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALCHAT_HOME", str(home))
    first = runner.invoke(app, ["chat"], input="My name is Ada.\n/save c1\n/quit\n")
    assert first.exit_code == 0 and "saved 'c1' (1 turn) with its KV cache (" in first.stderr, first.stderr
    second = runner.invoke(app, ["chat", "--resume", "c1"], input=f"{QUESTION}\n/quit\n")
    assert "KV cache loaded: " in second.stderr, second.stderr
    held = int(second.stderr.split("KV cache loaded: ")[1].split(" ")[0])
    assert f"(cached {held})" in second.stderr  # the figures line: only the new message was prefilled
    assert "kept 'c1' (2 turns) with its KV cache" in second.stderr  # leaving keeps it, with its cache
    unchanged = runner.invoke(app, ["chat", "--resume", "c1"], input="/quit\n")
    assert "KV cache loaded" in unchanged.stderr and "updated" not in unchanged.stderr
    pinned = runner.invoke(app, ["chat", "--resume", "c1", "--no-save-cache"], input="/pin I like tea.\n/quit\n")
    assert "kept 'c1' (2 turns); continue" in pinned.stderr  # a pin is a change; no cache this time
    assert not (home / "kv-cache" / "c1.safetensors").exists()
    assert "I like tea." in runner.invoke(app, ["sessions", "export", "c1", "--format", "json"]).stdout
    runner.invoke(app, ["chat", "--resume", "c1"], input=f"{QUESTION}\n/quit\n")
    listed = runner.invoke(app, ["sessions", "list"])
    assert "KB" in listed.stdout and "KV caches: " in listed.stdout
    assert str(home) not in listed.stdout.splitlines()[0]  # the table first; where it lives, below it
    assert "tokens of demo" in runner.invoke(app, ["sessions", "show", "c1"]).stdout
    removed = runner.invoke(app, ["sessions", "rm", "c1"])
    assert "and its KV cache" in removed.stderr and not (home / "kv-cache" / "c1.safetensors").exists()
    bad = runner.invoke(app, ["chat", "--cache-max-bytes", "lots", "hi"])
    assert bad.exit_code == 2 and "invalid size" in bad.stderr
    (home / "config.yaml").write_text("cache_max_bytes: -1\n")
    assert runner.invoke(app, ["chat", "hi"]).exit_code == 2
