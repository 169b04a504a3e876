"""Saved sessions: /save, --resume, sessions list|show|rm|export, a damaged or locked database,
concurrent writers, and replaying a saved session as a benchmark."""

import json
import multiprocessing
import sqlite3

import pytest
from typer.testing import CliRunner

from localchat.cli.app import app
from localchat.conversation.history import Turn
from localchat.conversation.stats import TurnStats
from localchat.store import saved_sessions as sessions
from localchat.store.saved_sessions import SavedSession, SessionStore, StoreError
from localchat.store.schema import MIGRATIONS

runner = CliRunner()
REMEMBER = "Remember the code harbor 17. Reply only OK."


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def repl(*lines: str, args: tuple[str, ...] = ()):
    return runner.invoke(app, ["chat", *args], input="\n".join(lines) + "\n")


def saved(name="s", uid="u1", turns=(("hi", "Hi there!"),)) -> SavedSession:
    return SavedSession(name, uid, "demo", "inproc", "You are a helpful assistant.", {"temperature": 0.0},
                        tuple(Turn(u, a, TurnStats(prompt_tokens=3)) for u, a in turns))


def test_save_quit_resume_continues_with_history(home):
    first = repl(REMEMBER, "Hello", "/save demo1", "/quit")
    assert first.exit_code == 0, first.stderr
    assert "saved 'demo1' (2 turns)" in first.stderr
    second = repl("/history", "/quit", args=("--resume", "demo1"))
    assert second.exit_code == 0, second.stderr
    assert "resumed 'demo1': 2 turn(s)" in second.stderr and "KV cache loaded" in second.stderr
    assert "user: " + REMEMBER in second.stderr and "assistant: OK" in second.stderr
    assert "history: 5 messages" in second.stderr


def test_resumed_turn_sends_the_saved_history(home, tmp_path):
    repl(REMEMBER, "/save demo1", "/quit")
    result = repl("Hello", "/save", "/quit", args=("--resume", "demo1", "--record", str(tmp_path / "r")))
    assert result.exit_code == 0, result.stderr
    request = json.loads(next((tmp_path / "r").glob("*-request.json")).read_text())
    assert [m["content"] for m in request["messages"]] == [
        "You are a helpful assistant.", REMEMBER, "OK", "Hello"]
    assert "updated 'demo1' (2 turns)" in result.stderr  # /save without NAME reuses the resumed name


def test_list_show_export_rm(home):
    repl(REMEMBER, "/save demo1", "/quit")
    listed = runner.invoke(app, ["sessions", "list"])
    assert listed.exit_code == 0 and "demo1" in listed.stdout and "demo" in listed.stdout
    shown = runner.invoke(app, ["sessions", "show", "demo1"])
    assert shown.exit_code == 0 and REMEMBER in shown.stdout and "[TTFT" in shown.stdout
    exported = json.loads(runner.invoke(app, ["sessions", "export", "demo1", "--format", "json"]).stdout)
    assert [m["role"] for m in exported["messages"]] == ["system", "user", "assistant"]
    assert exported["turn_stats"][0]["prompt_tokens"] > 0
    markdown = runner.invoke(app, ["sessions", "export", "demo1"]).stdout
    assert markdown.startswith("# demo1") and f"**User:** {REMEMBER}" in markdown
    assert runner.invoke(app, ["sessions", "rm", "demo1"]).exit_code == 0
    gone = runner.invoke(app, ["sessions", "show", "demo1"])
    assert gone.exit_code == 1 and "no saved session named 'demo1'" in gone.stderr


def test_a_name_held_by_another_conversation_is_not_overwritten(home):
    repl(REMEMBER, "/save mine", "/quit")
    other = repl("Hello", "/save mine", "/quit")
    assert "another conversation is already saved as 'mine'" in other.stderr
    store = sessions.default_store()
    assert [t.user for t in store.load("mine").turns] == [REMEMBER]


@pytest.mark.parametrize("args, needle", [
    (["chat", "--resume", "x", "--system", "hi"], "leave out --system"),
    (["chat", "--resume", "../x"], "invalid session name"),
])
def test_bad_session_input_is_a_usage_error(home, args, needle):
    sessions.default_store().save(saved("x"))
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and needle in result.stderr and "Traceback" not in result.stderr


def test_invalid_name_is_refused_in_the_repl(home):
    result = repl("Hello", "/save ../evil", "/quit")
    assert result.exit_code == 0 and "invalid session name" in result.stderr


def test_corrupted_database_is_reported_and_left_untouched(home):
    home.mkdir(parents=True)
    db = home / "sessions.sqlite3"
    garbage = b"this is not a database" * 100
    db.write_bytes(garbage)
    result = runner.invoke(app, ["sessions", "list"])
    assert result.exit_code == 1 and "is unreadable" in result.stderr and "Traceback" not in result.stderr
    in_repl = repl("Hello", "/save a", "/history", "/quit")
    assert in_repl.exit_code == 0 and "is unreadable" in in_repl.stderr
    assert "history: 3 messages" in in_repl.stderr  # the conversation itself is intact
    assert db.read_bytes() == garbage


def test_locked_database_is_a_clear_error_and_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(sessions, "BUSY_TIMEOUT_S", 0.2)
    store = SessionStore(tmp_path / "s.sqlite3")
    store.save(saved("a"))
    holder = sqlite3.connect(tmp_path / "s.sqlite3", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match="stayed locked"):
            store.save(saved("b", uid="u2"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [s.name for s in store.list()] == ["a"]


def _save_many(path: str, worker: int) -> None:
    store = SessionStore(__import__("pathlib").Path(path))
    for i in range(15):
        store.save(saved(f"w{worker}-{i}", uid=f"w{worker}-{i}", turns=[(f"q{i}", f"a{i}")] * (i % 4 + 1)))
        store.save(saved(f"w{worker}-{i}", uid=f"w{worker}-{i}", turns=[(f"q{i}", f"b{i}")] * 2))


def test_concurrent_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "s.sqlite3")
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_save_many, args=(path, w)) for w in range(3)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
    assert [p.exitcode for p in workers] == [0, 0, 0]
    store = SessionStore(tmp_path / "s.sqlite3")
    assert len(store.list()) == 45
    assert all([t.assistant for t in store.load(s.name).turns] == [f"b{s.name.split('-')[1]}"] * 2
               for s in store.list())


def test_newer_schema_is_refused(tmp_path):
    db = tmp_path / "s.sqlite3"
    SessionStore(db).save(saved())
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(StoreError, match="newer than this localchat understands"):
        SessionStore(db).load("s")


def test_replay_round_trip(home, tmp_path):
    repl(REMEMBER, "Hello", "What was the code? Reply with the code only.", "/save demo1", "/quit")
    result = runner.invoke(app, ["bench", "--replay", "demo1", "--history", "both", "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.stderr
    report = json.loads((tmp_path / "b" / "results.json").read_text())
    on = [t for t in report["turns"] if t["arm"] == "inproc history-on"]
    assert [t["user"] for t in on] == [REMEMBER, "Hello", "What was the code? Reply with the code only."]
    assert on[0]["answer"] == "OK"
    assert "--replay demo1" in report["environment"]["command"]


def test_a_write_built_on_an_older_state_is_refused_and_writes_nothing(tmp_path):
    """Two terminals (or a tab and a terminal) on one conversation: the one whose state is older
    than the stored one cannot write over a turn the other kept."""
    from localchat.store.saved_sessions import ContinuedElsewhere

    store = SessionStore(tmp_path / "s.sqlite3")
    first = store.save(saved(None, uid="c"), based_on=0)
    both = store.load("c")
    assert both.revision == first.revision
    second = store.save(saved(None, uid="c", turns=[("hi", "Hi there!"), ("t2", "a2")]), based_on=both.revision)
    assert second.revision == both.revision + 1
    with pytest.raises(ContinuedElsewhere, match="continued elsewhere.*2 turns"):
        store.save(saved(None, uid="c", turns=[("hi", "Hi there!"), ("other", "b2")]), based_on=both.revision)
    assert [t.user for t in store.load("c").turns] == ["hi", "t2"] and store.revision_of("c") == second.revision
