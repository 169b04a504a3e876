"""Nothing lost: every accepted turn kept as it commits (REPL and one-shot, both backends, tool steps
whole), ``chat --continue``, ``chat --resume`` alone, and ``localchat log`` to find things again;
what a kill, a full or read-only disk, two REPLs at once or an old database do to it."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from typer.testing import CliRunner

from fakeserver import FakeServer, Reply, delta, sse
from localchat.cli.app import app
from localchat.store.kv_files import DIR_NAME
from pty_chat import PROMPT, send, spawn

runner = CliRunner()
REMEMBER = "Remember the code harbor 17. Reply only OK."
RECALL = "What was the code? Reply with the code only."


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LOCALCHAT_API_KEY", raising=False)
    return tmp_path / "home"


def logged(home: Path) -> list[tuple]:
    with sqlite3.connect(home / "sessions.sqlite3") as db:
        return db.execute("SELECT uid, user, assistant, taken_back FROM log ORDER BY id").fetchall()


def turn(child, line: str) -> None:
    send(child, line)
    child.expect_exact("[TTFT")
    child.expect_exact(PROMPT)


# --- kept as it happens ---------------------------------------------------------------------------------

def test_a_repl_killed_between_turns_comes_back_whole_with_continue_and_log_finds_it(home):
    child = spawn(home=home)
    turn(child, REMEMBER)
    turn(child, "Hello")
    child.kill(signal.SIGKILL)
    child.close()
    assert [row[1] for row in logged(home)] == [REMEMBER, "Hello"]
    back = runner.invoke(app, ["chat", "--continue"], input=f"/history\n{RECALL}\n/quit\n")
    assert back.exit_code == 0, back.stderr
    assert "resumed" in back.stderr and "2 turn(s)" in back.stderr and "history: 5 messages" in back.stderr
    assert "harbor 17" in back.stdout  # it remembers: the conversation came back whole
    found = runner.invoke(app, ["log", "-q", "harbor"])
    assert (
        found.exit_code == 0
        and "**harbor**" in found.stdout
        and REMEMBER.replace("harbor", "**harbor**") in found.stdout
    )


def test_a_reply_cut_by_kill_9_is_never_kept(home):
    server = FakeServer()
    slow = Reply(chunks=sse(*[delta(f"w{i} ") for i in range(40)], delta("end", "stop")), pause_s=0.1)
    server.chat([Reply(chunks=sse(delta("OK", "stop"))), slow])
    try:
        child = spawn("--backend", "server", "--base-url", server.base_url, home=home)
        turn(child, REMEMBER)
        send(child, "Tell me a story.")
        child.expect_exact("w3")  # the reply is streaming
        child.kill(signal.SIGKILL)
        child.close()
    finally:
        server.close()
    assert [row[1:3] for row in logged(home)] == [(REMEMBER, "OK")]


def test_a_single_prompt_is_kept_and_a_failed_one_is_not(home):
    assert runner.invoke(app, ["chat", REMEMBER]).exit_code == 0
    server = FakeServer()
    server.chat(Reply(500, [b"down"], {"Content-Type": "text/plain"}))
    try:
        failed = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "Hi"])
    finally:
        server.close()
    assert failed.exit_code == 1
    assert [row[1] for row in logged(home)] == [REMEMBER]


def test_undo_and_retry_keep_the_log_whole_and_mark_what_was_taken_back(home):
    done = runner.invoke(app, ["chat"], input=f"{REMEMBER}\nHello\n/undo\n{RECALL}\n/retry\n/quit\n")
    assert done.exit_code == 0, done.stderr
    rows = logged(home)
    assert [(r[1], r[3]) for r in rows] == [(REMEMBER, 0), ("Hello", 1), (RECALL, 1), (RECALL, 0)]
    with sqlite3.connect(home / "sessions.sqlite3") as db:
        assert db.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == 2  # the state: what the history holds


def test_save_names_the_conversation_it_is_and_no_second_copy_is_made(home):
    done = runner.invoke(app, ["chat"], input=f"{REMEMBER}\n/save harbor\nHello\n/quit\n")
    assert done.exit_code == 0, done.stderr
    with sqlite3.connect(home / "sessions.sqlite3") as db:
        assert db.execute("SELECT name FROM sessions").fetchall() == [("harbor",)]
    listed = runner.invoke(app, ["log"])
    assert "harbor" in listed.stdout and "│ 2 " in listed.stdout
    assert "resumed 'harbor': 2 turn(s)" in runner.invoke(app, ["chat", "--resume", "harbor"], input="/quit\n").stderr


def test_a_system_message_and_settings_set_after_the_last_turn_come_back_with_continue(home):
    """``/set`` after the last turn is kept on leaving (it used to be lost: only new turns were
    written); a flag given on resuming wins, and is the conversation's from then on."""
    done = runner.invoke(app, ["chat"], input=f"{REMEMBER}\n/set system You are terse.\n/set top_k 7\n")
    assert done.exit_code == 0, done.stderr
    back = runner.invoke(app, ["chat", "--continue"], input="/set\n/quit\n")
    assert "top_k 7 ·" in back.stderr and "system 'You are terse.'" in back.stderr, back.stderr
    warmer = runner.invoke(app, ["chat", "--continue", "--temperature", "0.5"], input="/set\n/quit\n")
    assert "temperature 0.5 ·" in warmer.stderr and "top_k 7 ·" in warmer.stderr
    again = runner.invoke(app, ["chat", "--continue"], input="/set\n/quit\n")
    assert "temperature 0.5 ·" in again.stderr and "system 'You are terse.'" in again.stderr
    assert [row[1] for row in logged(home)] == [REMEMBER]  # settings are no turn of the log


def test_no_log_config_and_bench_keep_nothing(home):
    assert runner.invoke(app, ["chat", "--no-log", REMEMBER]).exit_code == 0
    assert runner.invoke(app, ["bench", "--repeat", "1", "--max-tokens", "8", "--script", "name-recall"]).exit_code == 0
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text("log: false\n")
    assert runner.invoke(app, ["chat", REMEMBER]).exit_code == 0
    assert not (home / "sessions.sqlite3").exists() or logged(home) == []
    (home / "config.yaml").write_text("log: maybe\n")
    bad = runner.invoke(app, ["chat", REMEMBER])
    assert bad.exit_code == 2 and "log must be true or false" in bad.stderr


def test_tool_steps_are_kept_whole_and_their_results_are_searched(home):
    server = FakeServer()
    call = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "x", "function": {
        "name": "add", "arguments": '{"a": 2, "b": 3}'}}]}, "finish_reason": "tool_calls"}]}
    server.chat([Reply(chunks=sse(call)), Reply(chunks=sse(delta("It is 5.", "stop")))])
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--tools",
                                   str(Path(__file__).parents[1] / "examples" / "tools" / "add.py"), "--approve-tools",
                                   "What is 2 plus 3?"])
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    found = runner.invoke(app, ["log", "-q", "add", "--json"])
    assert any(hit["field"] == "tools" for hit in json.loads(found.stdout)), found.stdout
    shown = runner.invoke(app, ["log", "show", json.loads(found.stdout)[0]["uid"]])
    assert 'tool: add({"a": 2, "b": 3}) → 5' in shown.stdout and "assistant: It is 5." in shown.stdout


# --- continuing --------------------------------------------------------------------------------------------

def test_continue_with_no_conversation_yet_and_resume_alone_without_a_terminal(home):
    nothing = runner.invoke(app, ["chat", "--continue"], input="/quit\n")
    assert nothing.exit_code == 1 and "no conversation to continue yet" in nothing.stderr
    runner.invoke(app, ["chat", REMEMBER])
    listed = runner.invoke(app, ["chat", "--resume"], input="/quit\n")
    assert listed.exit_code == 2 and REMEMBER[:40] in listed.stderr and "demo · 1 turn" in listed.stderr
    assert "--resume needs a name or an id here" in listed.stderr
    both = runner.invoke(app, ["chat", "--resume", "x", "--continue"], input="/quit\n")
    assert both.exit_code == 2 and "alternatives" in both.stderr


def test_resume_alone_on_a_terminal_lists_and_picks(home):
    for question in (REMEMBER, "Hello"):
        assert runner.invoke(app, ["chat", question]).exit_code == 0
    child = pexpect.spawn(sys.executable, ["-m", "localchat", "chat", "--resume"], encoding="utf-8", timeout=60,
                          env={**os.environ, "LOCALCHAT_HOME": str(home), "PROMPT_TOOLKIT_NO_CPR": "1",
                               "TERM": "xterm", "NO_COLOR": "1"}, dimensions=(40, 200))
    child.expect_exact("continue which (1-2, Enter for none)?")
    child.send("2\r")
    child.expect_exact("resumed")
    child.expect_exact(PROMPT)
    send(child, "/history")
    child.expect_exact(REMEMBER)  # 1 is the latest (Hello); 2 the one before
    child.expect_exact(PROMPT)
    send(child, "/quit")
    child.expect(pexpect.EOF)


# --- finding things ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("query, finds", [
    ('"harbor 17"', True), ("harb*", True), ("NEAR(code harbor)", True), ("harbor OR nothing", True),
    ("nothing", False), ("港口", True), ("harbor AND (", None), ('"unclosed', None), ("x" * 10_241, None),
])
def test_search_takes_fts5_queries_and_a_malformed_one_is_one_line(home, query, finds):
    for question in (REMEMBER, "记住代码：港口 17。只回答好的。"):
        assert runner.invoke(app, ["chat", question]).exit_code == 0
    done = runner.invoke(app, ["log", "-q", query])
    if finds is None:
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.exit_code == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
        return
    assert done.exit_code == 0, done.stderr
    assert ("**" in done.stdout) == finds, done.stdout


def test_model_and_since_filters_and_rm_then_search(home):
    assert runner.invoke(app, ["chat", REMEMBER]).exit_code == 0
    assert runner.invoke(app, ["chat", "-m", "demo-think", "--no-think", "Hello"]).exit_code == 0
    only = json.loads(runner.invoke(app, ["log", "-m", "demo-think", "--json"]).stdout)
    assert [c["model"] for c in only] == ["demo-think"]
    assert len(json.loads(runner.invoke(app, ["log", "--since", "1h", "--json"]).stdout)) == 2
    assert runner.invoke(app, ["log", "--since", "soon"]).exit_code == 2
    uid = json.loads(runner.invoke(app, ["log", "-q", "harbor", "--json"]).stdout)[0]["uid"]
    other = next(c["uid"] for c in only)
    shared = next(i for i, (a, b) in enumerate(zip(uid, other)) if a != b)
    assert runner.invoke(app, ["log", "rm", uid[:shared]]).exit_code == 2  # starts both: give more of it
    removed = runner.invoke(app, ["log", "rm", uid[:shared + 1]])
    assert removed.exit_code == 0 and "removed 1 conversation (1 logged turn)" in removed.stderr
    assert json.loads(runner.invoke(app, ["log", "-q", "harbor", "--json"]).stdout) == []
    assert runner.invoke(app, ["log", "rm", "--older-than", "30d", "--yes"]).exit_code == 0
    assert len(json.loads(runner.invoke(app, ["log", "--json"]).stdout)) == 1
    unasked = runner.invoke(app, ["log", "rm", "--all"])  # no terminal to ask on, and no --yes
    assert unasked.exit_code == 2 and "add --yes" in unasked.stderr
    assert len(json.loads(runner.invoke(app, ["log", "--json"]).stdout)) == 1
    assert runner.invoke(app, ["log", "rm", "--all", "--yes"]).exit_code == 0
    assert json.loads(runner.invoke(app, ["log", "--json"]).stdout) == []
    assert runner.invoke(app, ["log", "rm"]).exit_code == 2


def test_ids_are_whole_at_60_columns_and_any_unique_part_names_one(home, monkeypatch):
    assert runner.invoke(app, ["chat", REMEMBER]).exit_code == 0
    uid = json.loads(runner.invoke(app, ["log", "--json"]).stdout)[0]["uid"]
    monkeypatch.setenv("COLUMNS", "60")
    listed = runner.invoke(app, ["log"], env={"COLUMNS": "60"})
    assert listed.exit_code == 0 and uid in listed.stdout, listed.stdout
    shown = runner.invoke(app, ["log", "show", uid[-4:]])  # the random end of the id
    assert shown.exit_code == 0 and REMEMBER in shown.stdout, shown.stderr


def test_a_repl_left_without_an_accepted_turn_leaves_no_kv_cache(home):
    left = runner.invoke(app, ["chat", "--max-tokens", "2"], input="Tell me a long story.\n/quit\n")  # cut: not kept
    assert left.exit_code == 0, left.stderr
    caches = home / "kv-cache"
    assert not caches.exists() or not list(caches.glob("*.safetensors")), list(caches.iterdir())


# --- safety --------------------------------------------------------------------------------------------

def test_the_database_is_private_and_never_holds_the_api_key(home):
    key = "sk-canary-" + "5" * 24
    server = FakeServer()
    server.chat(Reply(chunks=sse(delta(f"your key is {key}", "stop"))))
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "Hi"],
                             env={"LOCALCHAT_API_KEY": key})
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    for path in home.glob("sessions.sqlite3*"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert key.encode() not in path.read_bytes()
    assert logged(home)[0][2] == "your key is [api key]"


def test_two_repls_at_once_each_keep_their_own_conversation(home):
    first, second = spawn(home=home), spawn(home=home)
    for k in range(3):
        turn(first, f"Remember the code first {k}. Reply only OK.")
        turn(second, f"Remember the code second {k}. Reply only OK.")
    for child in (first, second):
        send(child, "/quit")
        child.expect(pexpect.EOF)
    rows = logged(home)
    assert len(rows) == 6 and len({r[0] for r in rows}) == 2
    assert all((("first" in r[1]) == (r[0] == rows[0][0])) for r in rows)


def test_a_schema_4_database_with_tool_steps_and_pins_migrates_without_loss(tmp_path, monkeypatch):
    from localchat.store.schema import MIGRATIONS

    home = tmp_path / "home"
    home.mkdir()
    db = sqlite3.connect(home / "sessions.sqlite3")
    for number in range(4):
        db.executescript(MIGRATIONS[number])
    db.execute("PRAGMA user_version = 4")
    steps = json.dumps([{"text": "", "calls": [{"id": "abc123def", "name": "add", "arguments": {"a": 2, "b": 3}}],
                         "results": ["5"], "reasoning": ""}])
    for key, (name, uid) in enumerate((("sums", "u1"), ("sums-copy", "u1"), ("other", "u2")), 1):
        db.execute("INSERT INTO sessions VALUES (?, ?, ?, '2026-11-01 10:00:00', '2026-11-01 10:0%d:00', 'demo-tools', "
                   "'inproc', 'SYS', '{}', ?, 'notes')" % key, (key, name, uid, json.dumps(["the code is harbor 17"])))
        db.execute("INSERT INTO turns VALUES (?, 0, 'What is 2 plus 3?', 'The answer is 5.', NULL, NULL, ?)",
                   (key, steps))
    db.commit()
    db.close()
    monkeypatch.setenv("LOCALCHAT_HOME", str(home))
    shown = runner.invoke(app, ["sessions", "show", "sums"])
    assert shown.exit_code == 0, shown.stderr
    assert 'tool: add({"a": 2, "b": 3}) → 5' in shown.stdout and "pin 1" in shown.stdout and "notes" in shown.stdout
    assert {"sums", "sums-copy", "other"} <= set(runner.invoke(app, ["sessions", "list"]).stdout.split())
    with sqlite3.connect(home / "sessions.sqlite3") as migrated:
        assert migrated.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert migrated.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == 3
        assert migrated.execute("SELECT COUNT(DISTINCT uid) FROM sessions").fetchone()[0] == 3
    hits = json.loads(runner.invoke(app, ["log", "-q", "plus", "--json"]).stdout)
    assert len(hits) == 3


@pytest.fixture
def tiny_home(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"no tmpfs can be mounted here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_full_or_read_only_disk_during_a_chat_is_said_once_and_the_chat_goes_on(tiny_home, fault, demo):
    from localchat.backends import GenerationParams
    from localchat.backends.inproc import InProcessBackend
    from localchat.conversation.history import Conversation
    from localchat.conversation.turn import ChatSession
    from localchat.store.keeper import SessionSaver
    from localchat.store.saved_sessions import SessionStore

    store = SessionStore(tiny_home / "sessions.sqlite3")
    session = ChatSession(InProcessBackend(*demo, "demo"), Conversation(None), GenerationParams(max_tokens=24))
    keeper = SessionSaver(store, "u1", "demo", logging=True)
    keeper.start(session)
    assert session.ask(REMEMBER).committed and keeper.kept(session) is None
    if fault == "full":
        with open(tiny_home / "filler", "wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * 65536)
            except OSError:
                pass
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(tiny_home)], check=True)
    notes = []
    for question in ("Hello", RECALL, "Hello again"):
        assert session.ask(question).committed  # the chat goes on
        notes.append(keeper.kept(session))
    assert notes[0] is not None and "this conversation is not being kept" in notes[0] and "the chat goes on" in notes[0]
    assert notes[1:] == [None, None]  # said once
    if fault == "read-only":
        subprocess.run(["mount", "-o", "remount,rw", str(tiny_home)], check=True)
    else:
        (tiny_home / "filler").unlink()
    assert keeper.kept(session) is None  # the disk is back: the next write keeps all it missed
    assert [t.user for t in store.load("u1").turns] == [REMEMBER, "Hello", RECALL, "Hello again"]
    assert [row[1] for row in logged(tiny_home)] == [REMEMBER, "Hello", RECALL, "Hello again"]


def test_a_locked_database_during_a_repl_is_said_once_and_the_turns_are_kept_once_it_is_free(home):
    child = spawn(home=home)
    turn(child, REMEMBER)
    blocker = sqlite3.connect(home / "sessions.sqlite3", isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another program holds the database
    try:
        send(child, "Hello")
        child.expect_exact("this conversation is not being kept")
        child.expect_exact(PROMPT)
        turn(child, RECALL)  # the chat goes on, and the line is not said again
        assert "not being kept" not in child.before
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    turn(child, "Hello again")
    send(child, "/quit")
    child.expect(pexpect.EOF)
    assert [row[1] for row in logged(home)] == [REMEMBER, "Hello", RECALL, "Hello again"]


def test_leaving_kept_conversations_writes_their_kv_caches_under_the_cap(home):
    sizes = []
    for index in range(3):
        done = runner.invoke(app, ["chat", "--cache-max-bytes", "300K"], input=f"{REMEMBER} {index}\n/quit\n")
        assert done.exit_code == 0, done.stderr
        sizes.append(sum(f.stat().st_size for f in (home / DIR_NAME).rglob("*") if f.is_file()))
    assert all(size <= 300 * 1024 for size in sizes) and sizes[0] > 0
    assert "evicted the oldest" in done.stderr  # three would not fit: the oldest went
    again = runner.invoke(app, ["chat", "--continue"], input="/quit\n")
    assert "KV cache loaded" in again.stderr  # the latest one is there to continue


@pytest.mark.parametrize("answer, kept", [("", True), ("n", True), ("y", False), ("yes", False)])
def test_log_rm_asks_with_its_default_shown_and_no_is_the_default(monkeypatch, answer, kept):
    from localchat.cli import log as log_command
    from localchat.errors import UsageError

    asked = []

    class Console:
        def input(self, prompt, **_):
            asked.append(prompt)
            return answer

    monkeypatch.setattr(log_command.sys.stdin, "isatty", lambda: True)
    if kept:
        with pytest.raises(UsageError, match="nothing removed"):
            log_command._confirm_bulk(Console(), None)
    else:
        log_command._confirm_bulk(Console(), "30d")
    assert asked and asked[0].endswith("[y/N] ")
