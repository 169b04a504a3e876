"""The newest surfaces against an attacker and a clumsy user: the REPL's commands with hostile
arguments, saved KV caches and sessions against the file system, the input-history file, and
compaction against a hostile server. Each case: one line, the REPL (or the command) alive with the
right exit code, no traceback, and the history and files unchanged."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest
from typer.testing import CliRunner

from fakeserver import FakeServer, Reply, delta, sse
from localchat.backends import GenerationParams
from localchat.backends.inproc import InProcessBackend
from localchat.backends.openai_http import backend_for
from localchat.cli import clipboard
from localchat.cli.app import app
from localchat.cli.render import ChatUI
from localchat.cli.repl import Repl
from localchat.cli.repl.line_editor import private_history
from localchat.cli.terminal import TerminalConsole
from localchat.conversation.compaction import compact
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.store.kv_files import read_metadata
from pty_chat import PROMPT, quit, send, spawn

runner = CliRunner()
SYSTEM = "You are a helpful assistant."
REMEMBER = "Remember the code harbor 17. Reply only OK."
ROOT = os.geteuid() == 0
ENV = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1", "NO_COLOR": "1"}


def errors_of(err: io.StringIO, start: int) -> list[str]:
    return [line for line in err.getvalue()[start:].splitlines() if line.startswith("error:")]


class Tried:
    """A REPL on the demo model whose every command is checked: one error line, nothing changed."""

    def __init__(self, demo):
        model, tokenizer = demo
        self.err = io.StringIO()
        session = ChatSession(InProcessBackend(model, tokenizer, "demo"), Conversation(SYSTEM),
                              GenerationParams(max_tokens=24))
        self.repl = Repl(session, ChatUI(out=io.StringIO(), err=TerminalConsole(file=self.err, width=300)))

    @property
    def conversation(self) -> Conversation:
        return self.repl.session.conversation

    def refused(self, line: str, needle: str) -> str:
        start, before = len(self.err.getvalue()), self.state()
        signal.alarm(20)  # a command that hangs fails the test instead of the run
        try:
            assert self.repl.handle(line) is True
        finally:
            signal.alarm(0)
        errors = errors_of(self.err, start)
        assert len(errors) == 1 and needle in errors[0], (line[:80], self.err.getvalue()[start:])
        assert len(errors[0]) < 400 and "Traceback" not in self.err.getvalue()
        assert self.state() == before, line[:80]
        return errors[0]

    def state(self):
        c, params = self.conversation, self.repl.session.params
        return (list(c.turns), list(c.pins), c.summary, c.system, params, self.repl.attachment)


@pytest.fixture
def tried(demo):
    return Tried(demo)


def test_load_refuses_hostile_files_without_hanging(tried, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    fifo, sparse, loop = tmp_path / "fifo", tmp_path / "sparse", tmp_path / "loop"
    os.mkfifo(fifo)
    with open(sparse, "wb") as f:
        f.truncate(50 * 2**30)  # 50 GB of nothing, no disk
    loop.symlink_to(loop)
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "nul.txt").write_bytes(b"text\x00more")
    locked = tmp_path / "locked.txt"
    locked.write_text("secret")
    locked.chmod(0)
    cases = [(tmp_path, "is not a regular file"), (fifo, "is not a regular file"), ("/dev/zero", "not a regular"),
             ("/dev/urandom", "not a regular"), (sparse, "looks binary"), (tmp_path / "latin1.txt", "not UTF-8"),
             (tmp_path / "nul.txt", "looks binary"), ("~", "is not a regular file"),
             (loop, "Too many levels of symbolic links"), ("'a\x00b'", "NUL")]
    for path, needle in cases:
        tried.refused(f"/load {path}", needle)
    if not ROOT:  # root reads any file
        tried.refused(f"/load {locked}", "Permission denied")
    assert tried.repl.handle(REMEMBER) and len(tried.conversation.turns) == 1  # alive


@pytest.mark.parametrize("line, needle", [
    ("/set temperature nan", "finite"), ("/set temperature inf", "finite"), ("/set top_p 1e309", "(0, 1]"),
    ("/set temperature -1", "≥ 0"), ("/set top_k 99999999999999", "whole number"),
    ("/set max_tokens 0", "≥ 1"), ("/set min_p 1", "[0, 1)"), ("/set repetition_penalty 1e6", "(0, 100]"),
    ("/set system " + "x" * 1_000_000, "over the limit of 8000"),
    ("/set system " + "word " * 1500, "this system message would make"),
    ("/pin", "usage: /pin TEXT"), ("/pin    ", "usage: /pin TEXT"), ("/pin " + "y" * 9000, "over the limit"),
    ("/pin " + "word " * 1500, "this pin would make"),
    ("/unpin 0", "nothing is pinned"), ("/unpin -1", "nothing is pinned"), ("/unpin abc", "nothing is pinned"),
    ("/retry", "nothing to retry"), ("/undo", "no turn to take back"), ("/copy", "nothing to copy yet"),
])
def test_commands_refuse_hostile_arguments_in_one_line(tried, line, needle):
    tried.refused(line, needle)


def test_pins_compaction_and_undo_at_their_edges(tried):
    tried.repl.handle("/pin the user is Mei")
    for line in ("/unpin 0", "/unpin -1", "/unpin 999", "/unpin abc"):
        tried.refused(line, "usage: /unpin N, N from 1 to 1")
    start = len(tried.err.getvalue())
    for line in ("/compact", "/compact", "/uncompact"):
        assert tried.repl.handle(line)
    said = tried.err.getvalue()[start:]
    assert said.count("compaction: nothing to compact: 0 turn(s)") == 2 and "nothing to restore" in said
    assert tried.conversation.summary is None and tried.conversation.pins == ["the user is Mei"]


def test_copy_without_a_tool_or_with_one_that_hangs(tried, tmp_path, monkeypatch):
    tried.repl.handle("Hello")
    monkeypatch.setenv("PATH", str(tmp_path))
    tried.refused("/copy", "no clipboard tool found")
    hanging = tmp_path / "xclip"
    hanging.write_text("#!/bin/sh\nexec /bin/sleep 60\n")
    hanging.chmod(0o755)
    monkeypatch.setattr(clipboard, "TIMEOUT_S", 0.5)
    started = time.monotonic()
    tried.refused("/copy", "xclip did not finish within")
    assert time.monotonic() - started < 30  # not the hanging tool's 60 s


# --- saved KV caches and sessions against the file system ------------------------------------------

@pytest.fixture
def saved_home(tmp_path, monkeypatch):
    """A data directory holding one saved session 's' with its KV cache."""
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALCHAT_HOME", str(home))
    done = runner.invoke(app, ["chat"], input=f"{REMEMBER}\n/save s\n/quit\n")
    assert done.exit_code == 0 and "with its KV cache" in done.stderr, done.stderr
    return home


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def resume(*extra: str, lines: str = "/history\n/quit\n"):
    result = runner.invoke(app, ["chat", "--resume", "s", *extra], input=lines)
    assert result.exit_code == 0 and "Traceback" not in result.stderr, result.stderr
    assert "history: 3 messages" in result.stderr  # the messages came back whatever the cache was
    return result.stderr


def planted(home: Path, kind: str, tmp_path: Path) -> str:
    cache = home / "kv-cache" / "s.safetensors"
    cache.unlink()
    if kind == "link to a file":
        (tmp_path / "other").write_bytes(b"x" * 100)
        cache.symlink_to(tmp_path / "other")
    elif kind == "link to /etc/passwd":
        cache.symlink_to("/etc/passwd")
    elif kind == "fifo":
        os.mkfifo(cache)
    elif kind == "directory":
        cache.mkdir()
    elif kind == "50 GB sparse":
        with open(cache, "wb") as f:
            f.truncate(50 * 2**30)
    return {"link to a file": "is a symbolic link (never followed)", "link to /etc/passwd": "is a symbolic link",
            "fifo": "is not a regular file", "directory": "is not a regular file",
            "50 GB sparse": "over the cap"}[kind]


@pytest.mark.parametrize("kind", ["link to a file", "link to /etc/passwd", "fifo", "directory", "50 GB sparse"])
def test_a_planted_cache_file_is_refused_never_followed_or_read(saved_home, tmp_path, kind):
    needle = planted(saved_home, kind, tmp_path)
    passwd = digest(Path("/etc/passwd"))
    said = resume(lines="/history\nHello\n/quit\n" if kind.startswith("link") else "/history\n/quit\n")
    line = next(x for x in said.splitlines() if "KV cache" in x)
    assert line.startswith("resumed 's'") and "saved KV cache not used: " in line and needle in line, said
    assert digest(Path("/etc/passwd")) == passwd
    if kind == "link to a file":
        assert (tmp_path / "other").read_bytes() == b"x" * 100  # saving again replaced the link, not its target
        assert not (saved_home / "kv-cache" / "s.safetensors").is_symlink()


def test_a_cache_directory_that_is_a_link_is_never_used(saved_home, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (saved_home / "kv-cache").rename(tmp_path / "moved")
    (saved_home / "kv-cache").symlink_to(elsewhere)
    said = resume(lines="/history\nHello\n/save\n/quit\n")
    assert "kv-cache is a symbolic link" in said and "its KV cache was not kept" in said
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    removed = runner.invoke(app, ["sessions", "rm", "s"])
    assert removed.exit_code == 1 and "not its KV cache" in removed.stderr and list(elsewhere.iterdir()) == []


def test_an_unreadable_cache_is_one_line(saved_home):
    cache = saved_home / "kv-cache" / "s.safetensors"
    cache.chmod(0)
    said = resume()
    assert ("KV cache loaded" if ROOT else "saved KV cache not used") in said


def test_two_resumes_of_one_name_at_once_both_finish_and_leave_a_valid_session(saved_home):
    env = {**os.environ, "LOCALCHAT_HOME": str(saved_home)}
    children = [subprocess.Popen([sys.executable, "-m", "localchat", "chat", "--resume", "s"], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for _ in range(2)]
    outputs = [child.communicate(f"Hello number {i}\n/quit\n".encode(), timeout=120) for i, child in
               enumerate(children)]
    for child, (_, err) in zip(children, outputs):
        assert child.returncode == 0 and b"Traceback" not in err, err.decode()
    kept = [err for _, err in outputs if b"kept 's' (2 turns)" in err]
    refused = [err for _, err in outputs if b"continued elsewhere" in err]
    assert len(kept) == 1 and len(refused) == 1  # the second never writes over the first's turn
    assert refused[0].count(b"continued elsewhere") == 2  # its turn said not kept, and its leaving says so once
    shown = runner.invoke(app, ["sessions", "show", "s"])
    assert shown.exit_code == 0 and shown.stdout.count("Hello number") == 1
    assert json.loads(read_metadata(saved_home / "kv-cache" / "s.safetensors")["ids"])  # whole, readable
    assert not list((saved_home / "kv-cache" / "writing").iterdir())


@pytest.mark.parametrize("value, code", [("0", 0), ("5GB", 0), ("-1", 2), ("1e99", 2), ("abc", 2), ("", 2)])
def test_cache_max_bytes_values(saved_home, value, code):
    result = runner.invoke(app, ["chat", "--cache-max-bytes", value], input="Hello\n/save t\n/quit\n")
    assert result.exit_code == code and "Traceback" not in result.stderr, result.stderr
    if code == 2:
        assert [line for line in result.stderr.splitlines() if line.startswith("error:")][0].count("\n") == 0
        assert "--cache-max-bytes" in result.stderr
    elif value == "0":
        assert "its KV cache was not kept" in result.stderr and "over the cap" in result.stderr


@pytest.mark.parametrize("name", ["../x", "", "a/b", "n" * 5000, "a\nb", ".", "..", "x\x1b[2J"])
def test_sessions_rm_with_a_hostile_name_is_a_usage_error_and_removes_nothing(saved_home, name):
    before = digest(saved_home / "sessions.sqlite3")
    result = runner.invoke(app, ["sessions", "rm", name])
    assert result.exit_code == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "invalid session name" in errors[0] and len(errors[0]) < 200
    assert "\x1b" not in result.stderr and digest(saved_home / "sessions.sqlite3") == before
    assert (saved_home / "kv-cache" / "s.safetensors").is_file()


# --- the input-history file ---------------------------------------------------------------------------

def test_the_input_history_is_made_private_never_through_a_link_and_never_holds_the_key(tmp_path):
    notices: list[str] = []
    history = tmp_path / "input_history"
    history.write_text("\n# old\n+earlier line\n")
    history.chmod(0o644)
    kept = private_history(history, ["sk-secret-1"], notices.append)
    assert stat.S_IMODE(history.stat().st_mode) == 0o600 and "was mode 0644: made private" in notices[0]
    kept.store_string("my key is sk-secret-1")
    kept.store_string("a line")
    assert "a line" in history.read_text() and "sk-secret-1" not in history.read_text()
    target = tmp_path / "target"
    target.write_text("untouched")
    history.unlink()
    history.symlink_to(target)  # replaced while the session runs: the next line is not written through it
    kept.store_string("after")
    assert target.read_text() == "untouched"

    for kind, needle in [("link", "symbolic link"), ("directory", "directory"), ("fifo", "FIFO")]:
        path = tmp_path / kind
        {"link": lambda p=path: p.symlink_to(target), "directory": path.mkdir,
         "fifo": lambda p=path: os.mkfifo(p)}[kind]()
        with pytest.raises(OSError) as refused:
            private_history(path, [], notices.append)
        assert needle in (refused.value.strerror or "")
    assert target.read_text() == "untouched"


def test_the_repl_goes_on_with_history_in_memory_when_the_file_cannot_be_used(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "input_history").symlink_to("/etc/passwd")
    passwd = digest(Path("/etc/passwd"))
    child = pexpect.spawn(sys.executable, ["-m", "localchat", "chat", "--api-key", "sk-x-1"], encoding="utf-8",
                          timeout=60, dimensions=(40, 200), env={**ENV, "LOCALCHAT_HOME": str(home)})
    child.expect_exact("input history not kept")
    child.expect_exact("it is a symbolic link (not followed)")
    child.expect_exact(">>>")
    child.send("/quit\r")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and digest(Path("/etc/passwd")) == passwd


# --- compaction against a hostile server ---------------------------------------------------------------

def server_chat(server: FakeServer, turns: int = 3) -> ChatSession:
    answers = [Reply(chunks=sse(delta(f"answer {i}", "stop"))) for i in range(turns)]
    server.chat(answers)
    chat = ChatSession(backend_for(server.base_url, None), Conversation(SYSTEM), GenerationParams(max_tokens=32))
    for i in range(turns):
        assert chat.ask(f"question {i}").committed
    return chat


FIVE_MB = [delta("n" * 100_000) for _ in range(50)]
HOSTILE_SUMMARIES = {
    "empty": (sse(delta("", "stop")), "the summary was empty"),
    "only reasoning": (sse({"choices": [{"delta": {"reasoning": "hmm"}, "finish_reason": "stop"}]}),
                       "the summary was only reasoning"),
    "cut by length": (sse(delta("Notes: the code", "length")), "was cut at --max-tokens 32"),
    "5 MB": (sse(*FIVE_MB, delta(".", "stop")), "over --max-input-chars (8000)"),
    "escape sequences": (sse(delta("Notes: \x1b]0;PWNED\x07 the code", "stop")), "holds control characters"),
    "dropped mid-summary": ([b'data: {"choices": [{"delta": {"content": "Notes: the"}}]}\n\n'],
                            "ended before the reply finished"),
}


@pytest.mark.parametrize("case", HOSTILE_SUMMARIES, ids=HOSTILE_SUMMARIES.keys())
def test_a_hostile_summary_changes_nothing(case):
    chunks, why = HOSTILE_SUMMARIES[case]
    server = FakeServer()
    try:
        chat = server_chat(server)
        before = (list(chat.conversation.turns), chat.conversation.summary)
        server.chat(Reply(chunks=chunks))
        done = compact(chat, keep=1)
    finally:
        server.close()
    assert not done.ok and why in done.reason, done.reason
    assert (list(chat.conversation.turns), chat.conversation.summary) == before


def test_ctrl_c_during_compact_keeps_every_turn(tmp_path):
    server = FakeServer()
    answers = [Reply(chunks=sse(delta(f"answer {i}", "stop"))) for i in range(3)]
    slow = Reply(chunks=sse(*[delta("Notes ") for _ in range(40)], delta(".", "stop")), pause_s=0.25)
    server.chat([*answers, slow])
    child = spawn("--backend", "server", "--base-url", server.base_url, home=tmp_path)
    try:
        for i in range(3):
            send(child, f"question {i}")
            child.expect_exact("[TTFT")
            child.expect_exact(PROMPT)
        send(child, "/compact")
        time.sleep(1.5)  # the summary is streaming
        child.sendintr()
        child.expect_exact("compaction: the summary was interrupted; nothing changed")
        child.expect_exact(PROMPT)
        send(child, "/history")
        child.expect_exact("history: 6 messages")  # three turns, no system message
        child.expect_exact(PROMPT)
        quit(child)
    finally:
        child.close(force=True)
        server.close()
