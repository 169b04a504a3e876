"""The model's context window, signals at any moment, a server that cannot start, and bench
against a faulty server: each ends cleanly, says what happened, and keeps what it must."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fakeserver import FakeServer, Reply, sse
from localchat.backends import GenerationParams
from localchat.cli.app import app
from localchat.conversation.history import Conversation, Turn
from localchat.conversation.turn import ChatSession, TurnStatus
from localchat.errors import UsageError
from localchat.server.launch import free_port
from owned import wait_until_localchat_runs

runner = CliRunner()


def test_a_prompt_over_the_models_context_is_refused_before_anything_is_sent(demo_backend, tmp_path):
    result = runner.invoke(app, ["chat", "--max-input-chars", "100000", "--record", str(tmp_path),
                                 "harbor " * 3000])
    assert result.exit_code == 2, result.stderr
    assert "over the model's context (1024 tokens less --max-tokens 64)" in result.stderr
    assert list(tmp_path.iterdir()) == []  # not even a request record: nothing was sent


def test_history_is_trimmed_by_whole_turns_to_fit_the_context(demo_backend):
    session = ChatSession(demo_backend, Conversation("You are a helpful assistant."),
                          GenerationParams(max_tokens=64))
    for _ in range(6):
        session.conversation.commit(Turn("Note: " + "harbor river falcon " * 60, "OK"))
    result = session.ask("Remember the code harbor 17. Reply only OK.")
    assert result.dropped_turns >= 1 and "the model's context" in result.trimmed_for
    assert result.stats.prompt_tokens <= 1024 - 64
    assert result.committed and len(session.conversation.turns) == 7 - result.dropped_turns


def test_max_tokens_that_leave_no_room_is_a_usage_error(demo_backend):
    session = ChatSession(demo_backend, Conversation(), GenerationParams(max_tokens=2000))
    with pytest.raises(UsageError, match="leaves no room"):
        session.ask("hi")


def test_the_users_tighter_budget_still_wins(demo_backend):
    session = ChatSession(demo_backend, Conversation(), GenerationParams(max_tokens=64))
    session.trim.max_context_tokens = 30
    session.conversation.commit(Turn("Remember the code harbor 17. Reply only OK.", "OK"))
    result = session.ask("What was the code? Reply with the code only.")
    assert result.dropped_turns == 1 and result.trimmed_for == "--max-context-tokens"


def spawn(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "localchat", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.8])
def test_ctrl_c_at_any_moment_is_one_line_and_130(delay):
    """Early (imports), or while the model loads: never a KeyboardInterrupt traceback."""
    proc = spawn("chat", "Remember the code harbor 17. Reply only OK.")
    wait_until_localchat_runs(proc.pid)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err
    assert proc.returncode in (130, 0), err  # 0: it had already answered
    if proc.returncode == 130:
        assert err.strip().splitlines()[-1] == "interrupted"


def test_sigterm_mid_reply_discards_the_turn_records_it_and_exits_143(rambling_model, tmp_path):
    proc = spawn("chat", "-m", str(rambling_model), "--system", "", "--max-tokens", "3000",
                 "--record", str(tmp_path), "hello")
    assert proc.stdout.read(20)  # the reply is streaming
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "terminated (SIGTERM)" in err
    response = json.loads(next(tmp_path.glob("*-response.json")).read_text())
    assert response["status"] == "interrupted" and response["signal"] == "SIGTERM"
    assert not response["committed"] and next(tmp_path.glob("*-request.json"))


def test_serve_with_a_model_that_cannot_load_fails_within_seconds(tmp_path, broken_model):
    broken = broken_model
    started = time.monotonic()
    proc = spawn("serve", "-m", str(broken), "--port", str(free_port()),
                 env={**os.environ, "LOCALCHAT_HOME": str(tmp_path / "home")})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and time.monotonic() - started < 30
    assert "failed to start" in err and "nosucharch" in err  # the child's exception line says why
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err and 'File "' not in err
    log = Path(errors[0].rsplit("(log: ", 1)[1].rstrip(")"))
    assert log.is_file() and oct(log.stat().st_mode & 0o777) == "0o600" and not str(log).startswith("/tmp/localchat")


def test_bench_against_a_server_that_breaks_every_turn_says_so_and_exits_1(tmp_path):
    fake = FakeServer()
    try:
        fake.chat(Reply(chunks=sse({"choices": [None]})))
        script = tmp_path / "s.yaml"
        script.write_text("conversations: [{turns: [{user: hi}, {user: again}]}]\n")
        result = runner.invoke(app, ["bench", "--backend", "server", "--base-url", fake.base_url,
                                     "--script", str(script), "--history", "on", "--format", "json"])
    finally:
        fake.close()
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert "2 of 2 turns failed" in result.stderr and "'choices[0]' is not an object" in result.stderr
    assert {t["status"] for t in json.loads(result.stdout)["turns"]} == {TurnStatus.ERROR.value}


@pytest.mark.parametrize("plain", [False, True], ids=["markdown", "plain"])
def test_ctrl_c_during_a_one_shot_reply_leaves_its_partial_text_on_the_screen_once(plain, tmp_path):
    """What the terminal shows (a pty, emulated by pyte) after Ctrl+C mid-reply: every line of the
    partial answer once. (The live region's lines were padded to the last column, where the tty's
    ``^C`` echo wrapped, and the region's last line stayed above the reply's final text.)"""
    import pexpect
    import pyte

    from fakeserver import delta

    server = FakeServer()
    server.chat(Reply(chunks=sse(*[delta(f" w{i}" + ("\n\n" if i % 25 == 24 else "")) for i in range(2000)]),
                      pause_s=0.01))
    env = {"PATH": "/usr/bin:/bin", "TERM": "xterm", "LOCALCHAT_HOME": str(tmp_path), "NO_COLOR": "1"}
    try:
        child = pexpect.spawn(sys.executable, ["-m", "localchat", "chat", "--backend", "server", "--base-url",
                                               server.base_url, "-m", "m", *(["--plain"] if plain else []), "hello"],
                              encoding="utf-8", timeout=60, dimensions=(400, 100), env=env)
        child.expect("w130 ")
        shown = child.before + child.after
        child.sendintr()
        child.expect(pexpect.EOF)
        shown += child.before
    finally:
        server.close()
    screen = pyte.Screen(100, 400)
    pyte.Stream(screen).feed(shown)
    words = " ".join(screen.display).split()
    streamed = [w for w in words if w.startswith("w") and w[1:].isdigit()]
    assert len(streamed) >= 130 and len(streamed) == len(set(streamed)), streamed  # each word once
    assert streamed == [f"w{i}" for i in range(len(streamed))] and "interrupted" in words


def test_a_sigterm_during_the_cleanup_after_one_lets_it_finish_and_a_lost_one_is_raised_again():
    """The first SIGTERM raises; more while its cleanup runs raise nothing (a handler that took a
    lock there hung serve for good). One lost where Python cannot raise it (a finalizer, an at-fork
    callback) is kept for the waiting loop, not printed, and the next SIGTERM raises again; any
    other unraisable error is still printed."""
    script = """
import os, signal
from localchat.errors import TerminationRequested, raise_if_set, raise_on_sigterm
termination = raise_on_sigterm()
try:
    os.kill(os.getpid(), signal.SIGTERM)
except TerminationRequested:
    for _ in range(3):
        os.kill(os.getpid(), signal.SIGTERM)  # while cleaning up
    print("cleaned up")
termination = raise_on_sigterm()
class Dying:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
class Broken:
    def __del__(self):
        raise ValueError("still shown")
Dying(); Broken()
try:
    raise_if_set(termination)
except TerminationRequested:
    print("kept")
try:
    os.kill(os.getpid(), signal.SIGTERM)
except TerminationRequested:
    print("raised again")
raise_on_sigterm()  # (the one above was handled: a fresh start)
Dying()  # lost, then the handler installed anew (a command after the CLI's start): not forgotten
try:
    raise_if_set(raise_on_sigterm())
except TerminationRequested:
    print("still")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["cleaned", "up", "kept", "raised", "again", "still"], done
    assert "TerminationRequested" not in done.stderr and "ValueError: still shown" in done.stderr
