"""The real REPL in a pseudo-terminal on the demo model (pexpect), as a user types it: line
editing by prompt_toolkit (history across sessions, paste, completion), the commands, Markdown."""

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest

import pty_chat
from fakeserver import FakeServer, Reply, delta, sse
from pty_chat import PROMPT, quit, send

PASTE = "\x1b[200~{}\x1b[201~"  # a terminal's bracketed paste
UP, CTRL_R = "\x1b[A", "\x12"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Each test's own data directory: the input history never touches the user's."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def spawn(*args: str, path: str = "/usr/bin:/bin", color: bool = False) -> pexpect.spawn:
    return pty_chat.spawn(*args, home=os.environ["LOCALCHAT_HOME"], color=color, path=path)


def test_remembers_with_history():
    child = spawn()
    send(child, "Remember the code harbor 17. Reply only OK.")
    child.expect_exact("OK")
    child.expect_exact("[TTFT")
    child.expect_exact(PROMPT)
    send(child, "What was the code? Reply with the code only.")
    child.expect_exact("harbor 17", timeout=20)
    child.expect_exact(PROMPT)
    quit(child)


def test_forgets_without_history():
    child = spawn("--no-history")
    send(child, "Remember the code harbor 17. Reply only OK.")
    child.expect_exact("[TTFT")  # "OK" alone would match the redrawn line
    child.expect_exact(PROMPT)
    send(child, "What was the code? Reply with the code only.")
    child.expect_exact("I don't know.", timeout=20)
    child.expect_exact(PROMPT)
    quit(child)


def test_multiline_input_between_triple_quotes():
    child = spawn("--system", "")
    send(child, '"""')
    send(child, "Remember the code harbor 17.")
    send(child, "Reply only OK.")
    send(child, '"""')
    child.expect_exact("[TTFT")
    child.expect_exact(PROMPT)
    send(child, "/history")
    child.expect(r"history: (\d) messages")
    assert child.match.group(1) == "2"  # the two lines went as one message, and the greedy reply "OK" was kept
    child.expect_exact("user: Remember the code harbor 17.\r\n     Reply only OK.")  # later lines indented
    quit(child)


def test_ctrl_c_mid_reply_discards_the_turn(rambling_model):
    child = spawn("-m", str(rambling_model), "--system", "", "--max-tokens", "3000")
    send(child, "hello")
    time.sleep(1.5)  # the reply is streaming (3000 tokens take seconds), rendered as Markdown
    child.sendintr()
    child.expect_exact("interrupted")
    child.expect_exact(PROMPT)
    send(child, "/history")
    child.expect_exact("history: 0 messages")
    child.expect_exact(PROMPT)
    send(child, "/stats")
    child.expect_exact("turns 0 (1 more interrupted)")  # an interrupted turn is no turn of the figures
    child.expect_exact(PROMPT)
    child.send("half typed")
    child.sendintr()  # Ctrl+C at the prompt clears the line and says how to leave
    child.expect_exact("(Ctrl+C clears the line; /quit or Ctrl+D leaves)")
    child.expect_exact(PROMPT)
    send(child, "/history")
    child.expect_exact("history: 0 messages")  # "half typed" was never sent
    child.expect_exact(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.parametrize("line", ["/bogus", ""])
def test_unknown_command_and_empty_line_send_nothing(line):
    child = spawn()
    send(child, line)
    if line:
        child.expect_exact("unknown command")
    send(child, "/stats")
    child.expect_exact("turns 0")
    quit(child)


def turn_done(child: pexpect.spawn) -> None:
    child.expect_exact("[TTFT")
    child.expect_exact(PROMPT)


def test_input_history_is_kept_across_sessions_privately_and_never_holds_the_key(home):
    child = spawn("--api-key", "sk-test-4242")
    send(child, "Remember the code harbor 17. Reply only OK.")
    turn_done(child)
    send(child, "/preview my key is sk-test-4242")
    child.expect_exact("preview:")
    quit(child)
    history = home / "input_history"
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    assert "Remember the code harbor 17" in history.read_text() and "sk-test-4242" not in history.read_text()

    child = spawn()
    child.send(UP + UP + "\r")  # the previous session's lines, newest first (/quit, then the question)
    child.expect_exact("OK")
    turn_done(child)
    child.send(CTRL_R + "harb")  # reverse search finds it too
    time.sleep(0.3)
    child.send("\r\r")
    turn_done(child)
    send(child, "/history")
    child.expect_exact("history: 5 messages")
    quit(child)


def test_no_input_history_writes_nothing(home):
    child = spawn("--no-input-history")
    send(child, "Hello")
    turn_done(child)
    quit(child)
    assert not (home / "input_history").exists()


def test_a_pasted_block_is_one_message_and_tab_completes_commands():
    child = spawn("--system", "")
    child.send(PASTE.format("Remember the code harbor 17.\nReply only OK."))
    time.sleep(0.3)
    child.send("\r")
    turn_done(child)
    child.send("/hist\t")
    time.sleep(0.3)
    child.send("\r")
    child.expect_exact("history: 2 messages")
    child.expect_exact("user: Remember the code harbor 17.\r\n     Reply only OK.")  # later lines indented
    quit(child)


def test_retry_undo_set_and_their_bad_arguments():
    child = spawn()
    send(child, "Remember the code harbor 17. Reply only OK.")
    turn_done(child)
    for line, said in [("/set temperature warm", "temperature must be a finite number ≥ 0"),
                       ("/set top_k -3", "top_k must be a whole number ≥ 0"), ("/set colour blue", "unknown setting"),
                       ("/set top_k 5", "top_k 5 from the next turn"), ("/set", "top_k 5"),
                       ("/set system You are terse.", "system message set"), ("/unpin x", "nothing is pinned")]:
        send(child, line)
        child.expect_exact(said)
        child.expect_exact(PROMPT)
    send(child, "/retry")
    turn_done(child)
    send(child, "/history")
    child.expect_exact("history: 3 messages")  # the retried answer replaced the old one
    child.expect_exact("system: You are terse.")
    send(child, "/undo")
    child.expect_exact("took back the last turn (Remember the code harbor 17. Reply only…); 0 turns left")
    send(child, "/undo")
    child.expect_exact("no turn to take back")
    send(child, "/retry")
    child.expect_exact("nothing to retry")
    quit(child)


def test_load_puts_a_file_into_the_next_message_and_refuses_what_it_must(tmp_path):
    (tmp_path / "notes.md").write_text("The code is harbor 17.\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01binary")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    child = spawn()
    for line, said in [("/load", "usage: /load FILE"), (f"/load {tmp_path}/missing.txt", "no such file"),
                       (f"/load {tmp_path}", "is not a regular file"), ("/load /dev/zero", "is not a regular file"),
                       (f"/load {tmp_path}/blob.bin", "looks binary"), (f"/load {tmp_path}/latin1.txt", "not UTF-8"),
                       ('/load "unclosed', "No closing quotation"),
                       (f"/load {tmp_path}/notes.md", "loaded")]:
        send(child, line)
        child.expect_exact(said)
        child.expect_exact(PROMPT)
    child.expect_exact("")
    send(child, "Hello")
    turn_done(child)
    send(child, "/history")
    child.expect_exact(f"user: {tmp_path}/notes.md:\r\n     ```\r\n     The code is harbor 17.\r\n     ```\r\n\r\n    "
                       " Hello")
    quit(child)


def fake_tool(directory: Path, name: str, body: str) -> None:
    tool = directory / name
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)


def test_copy_uses_the_platform_tool_or_says_none_is_found(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    child = spawn(path=f"{bin_dir}:/usr/bin:/bin")
    send(child, "/copy")
    child.expect_exact("nothing to copy yet")
    send(child, "Hello")
    turn_done(child)
    if not any(Path(d, t).exists() for d in ("/usr/bin", "/bin") for t in ("xclip", "xsel", "wl-copy")):
        send(child, "/copy")
        child.expect_exact("no clipboard tool found (tried xclip, xsel)")
        child.expect_exact(PROMPT)
    fake_tool(bin_dir, "xclip", f'cat > "{tmp_path}/clipboard"')
    send(child, "/copy")
    child.expect_exact("with xclip")
    quit(child)
    assert (tmp_path / "clipboard").read_text() == "Hello! How can I help?"


MARKDOWN = "# Plan\n\nSome **bold** words.\n\n```python\nprint('hi')\n```\n"


@pytest.fixture
def markdown_server():
    server = FakeServer()
    pieces = [p for p in re.findall(r"\S*\s*", MARKDOWN) if p]  # word by word, as a model streams
    server.chat(Reply(chunks=sse(*[delta(piece) for piece in pieces[:-1]], delta(pieces[-1], "stop"))))
    yield server
    server.close()


def test_markdown_is_rendered_on_a_terminal_and_raw_through_a_pipe(markdown_server):
    args = ["--backend", "server", "--base-url", markdown_server.base_url]
    child = spawn(*args, color=True)
    send(child, "Plan it")
    child.expect_exact("[TTFT")
    shown = child.before
    child.expect_exact(PROMPT)
    assert "```" not in shown and "**bold**" not in shown and "print" in shown and "\x1b[" in shown
    quit(child)
    piped = subprocess.run([sys.executable, "-m", "localchat", "chat", *args, "Plan it"], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == MARKDOWN + "\n"  # the raw text, as the model wrote it


def test_plain_turns_markdown_off_on_a_terminal(markdown_server):
    child = spawn("--backend", "server", "--base-url", markdown_server.base_url, "--plain")
    send(child, "Plan it")
    child.expect_exact("```python")
    turn_done(child)
    quit(child)
