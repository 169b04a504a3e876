"""A model's or a server's text never acts on the terminal: control characters and escape sequences
are shown visibly on a terminal (answers, reasoning, /history, /preview, /pins, summaries, error
bodies, model and file names), while pipes, --json and records keep the exact text."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fakeserver import FakeServer, Reply, delta, sse
from localchat.cli.app import app
from localchat.cli.markdown import MarkdownStream
from localchat.cli.render import ChatUI
from localchat.cli.terminal import TerminalConsole
from localchat.conversation.result import TurnResult, TurnStatus
from localchat.conversation.stats import TurnStats
from localchat.safe_text import visible
from pty_chat import PROMPT, quit, send, spawn

runner = CliRunner()
# A title, a cleared and recoloured screen, Rich markup, a cursor-position request (C1 CSI), the
# clipboard (OSC 52), a hyperlink (OSC 8), a DCS query and a carriage return that hides text.
HOSTILE = ("hi \x1b]0;PWNED\x07 there \x1b[2J\x1b[31mred [bold]x[/bold] \x9b6n \x1b]52;c;aGk=\x07 "
           "\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ \x1bP+q544e\x1b\\ rm -rf /\rls")
SHOWN = "hi ^[]0;PWNED^G there ^[[2J^[[31mred [bold]x[/bold] \\x9b6n"
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
LIVE_CONTROLS = re.compile(r"\r|\x1b\[2K|\x1b\[1A|\x1b\[\?25[lh]")  # Rich's own cursor moves while redrawing


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def finished(text: str) -> TurnResult:
    return TurnResult(prompt="q", messages=[], text=text, stats=TurnStats(finish_reason="stop"),
                      status=TurnStatus.COMMITTED)


def test_every_control_character_is_shown_visibly():
    assert visible("a\x1b[2Jb") == "a^[[2Jb"
    assert visible("bell\x07 del\x7f nul\x00 csi\x9b") == "bell^G del^? nul^@ csi\\x9b"
    assert visible("line\r\nnext\tcol\rover") == "line\nnext\tcol^Mover"
    assert visible(HOSTILE).count("\x1b") == 0 and visible(visible(HOSTILE)) == visible(HOSTILE)


def pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


ANY_TEXT = st.one_of(st.binary(max_size=120).map(lambda b: b.decode("latin-1")), st.text(max_size=120),
                     st.sampled_from([HOSTILE, "\x1b", "\r\n\r", "\x9b\x9d\x90"]))


@settings(max_examples=150, deadline=None)
@given(text=ANY_TEXT, cuts=st.lists(st.integers(0, 200), max_size=6))
def test_a_terminal_gets_no_control_character_and_a_pipe_gets_the_exact_text(text, cuts):
    tty, pipe = Tty(), io.StringIO()
    for out in (tty, pipe):
        ui = ChatUI(out=out, err=TerminalConsole(file=io.StringIO()), show_stats=False, markdown=False)
        for piece in pieces(text, cuts):
            ui.text(piece)
        ui.end_turn(finished(text), 32)
    assert not CONTROLS.search(tty.getvalue().replace("\n", "").replace("\t", ""))
    assert pipe.getvalue() == text + ("\n" if text else "")

    rendered = Tty()
    stream = MarkdownStream(TerminalConsole(file=rendered, force_terminal=True, color_system=None, width=80))
    for piece in pieces(text, cuts):
        stream.feed(piece)
    stream.close()
    shown = LIVE_CONTROLS.sub("", rendered.getvalue())
    assert not CONTROLS.search(shown.replace("\n", "").replace("\t", ""))


def test_reasoning_history_and_notices_on_stderr_are_shown_visibly():
    err = io.StringIO()
    ui = ChatUI(out=io.StringIO(), err=TerminalConsole(file=err, width=200), show_thinking=True)
    ui.reasoning(HOSTILE)
    ui.messages([{"role": "user", "content": HOSTILE}], "history: 1 message")
    ui.error(HOSTILE)
    ui.notice(HOSTILE)
    ui.info(HOSTILE)
    shown = err.getvalue()
    assert "\x1b" not in shown and "\x9b" not in shown and "\x07" not in shown
    assert shown.count(SHOWN) == 5 and shown.count("[bold]x[/bold]") == 5  # markup in the text is text


@pytest.fixture
def hostile_server():
    server = FakeServer()
    server.chat(Reply(chunks=sse(delta(HOSTILE[:30]), delta(HOSTILE[30:], "stop"))))
    yield server
    server.close()


@pytest.mark.parametrize("plain", [False, True], ids=["markdown", "plain"])
def test_a_hostile_answer_is_inert_on_a_terminal_and_exact_through_a_pipe(hostile_server, plain, tmp_path):
    args = ["--backend", "server", "--base-url", hostile_server.base_url, *(["--plain"] if plain else [])]
    child = spawn(*args, home=tmp_path)
    send(child, "hello")
    child.expect_exact("[TTFT")
    shown = child.before
    send(child, "/history")
    child.expect_exact("history: 2 messages")
    child.expect_exact(PROMPT)
    shown += child.before
    quit(child)
    for attack in ("\x1b]0;PWNED", "\x1b[2J", "\x1b[31mred", "\x9b6n", "\x1b]52;", "\x1b]8;;", "\x1bP+q", "\x07"):
        assert attack not in shown
    assert "^[]0;PWNED^G" in shown and "[bold]x[/bold]" in shown and "rm -rf /^Mls" in shown

    piped = subprocess.run([sys.executable, "-m", "localchat", "chat", *args, "hello"], capture_output=True,
                           timeout=60, env={**os.environ, "LOCALCHAT_HOME": str(tmp_path)})
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.decode() == HOSTILE + "\n"  # data: the exact text (bytes: no newline translation)


def test_every_surface_on_stderr_shows_server_and_user_text_visibly(tmp_path, monkeypatch):
    """Answers' echoes in /history, /preview, /pins, a summary, an error body, a model name and a
    file name: stderr is for people, so it is always sanitised; records keep the exact text."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    server = FakeServer()
    answer = Reply(chunks=sse(delta(HOSTILE, "stop")))
    summary = Reply(chunks=sse(delta("Note: " + HOSTILE, "stop")))
    refusal = Reply(404, [json.dumps({"error": {"message": HOSTILE}}).encode()], {"Content-Type": "application/json"})
    server.chat([answer, answer, answer, summary, refusal])
    try:
        typed = HOSTILE.replace("\r", " ")  # a line as typed (a carriage return would end it)
        lines = ["one " + typed, "two", "three", f"/preview {typed}", f"/pin {typed}", "/pins",
                 "/compact", "four", "/load '/nonexistent/\x1b]0;PWNED\x07'", "/history", "/quit"]
        result = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--record",
                                     str(tmp_path / "records")], input="\n".join(lines) + "\n")
        named = runner.invoke(app, ["chat", "-m", HOSTILE, "x"])
    finally:
        server.close()
    assert result.exit_code == 0, result.stderr
    shown = result.stderr + named.stderr
    assert not CONTROLS.search(shown.replace("\n", "").replace("\t", ""))
    assert "compaction: the summary holds control characters; nothing changed" in result.stderr
    assert f"HTTP 404 from {server.base_url}/chat/completions: hi ^[]0;PWNED^G" in result.stderr
    assert "/load: no such file: /nonexistent/^[]0;PWNED^G" in result.stderr
    assert result.stderr.count("pin: hi ^[]0;PWNED^G") == 1 and "preview: " in result.stderr
    assert "unknown model 'hi ^[]0;PWNED^G" in named.stderr and named.exit_code == 2
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "records").glob("*-response.json"))]
    assert records[0]["text"] == HOSTILE  # data keeps the exact text


def test_status_lines_and_help_wrap_at_words_on_a_terminal_at_60_columns_and_stay_whole_in_a_pipe():
    from localchat.cli.render import ChatUI
    from localchat.cli.repl.commands import COMMANDS
    from localchat.cli.terminal import console
    from localchat.conversation.stats import TurnStats, stats_line

    line = stats_line(TurnStats(prompt_tokens=2740, cached_tokens=256, completion_tokens=52, ttft_s=0.42,
                                decode_tps=41.2, total_s=1.7, cache_miss_tokens=215))
    shown = io.StringIO()
    terminal = console(shown, stderr=True, soft_wrap=None, force_terminal=True, width=60)
    terminal.print(line, markup=False)
    ChatUI(out=io.StringIO(), err=terminal).help([(f"{c.name} {c.usage}".strip(), c.summary)
                                                 for c in COMMANDS.values()])
    rows = re.sub(r"\x1b\[[0-9;]*m", "", shown.getvalue()).splitlines()
    assert all(len(row) <= 60 for row in rows), rows
    words = {w for row in rows for w in row.split()}
    assert {"dropped", "215", "cached]", "localchat", "--resume"} <= words, rows  # no word cut in two
    piped = io.StringIO()
    console(piped, soft_wrap=None, width=60).print(line, markup=False)
    assert piped.getvalue() == line + "\n"


def test_hints_name_the_command_as_it_was_run():
    """``uv run localchat`` under uv run, ``python -m localchat`` when run so: a hint is typed as is."""
    import os
    import subprocess
    import sys

    probe = "from localchat.wording import run_as; print(run_as())"
    env = {k: v for k, v in os.environ.items() if k != "UV_RUN_RECURSION_DEPTH"}
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    under_uv = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                              env=env | {"UV_RUN_RECURSION_DEPTH": "1"})
    assert plain.stdout.strip() == "localchat" and under_uv.stdout.strip() == "uv run localchat"


def test_a_ctrl_c_during_a_redraw_comes_once_the_redraw_is_whole():
    import os
    import signal

    from localchat.cli.markdown import whole

    finished = []
    with pytest.raises(KeyboardInterrupt):
        with whole():
            os.kill(os.getpid(), signal.SIGINT)
            finished.append("the redraw")  # not cut: the interrupt waits
    assert finished == ["the redraw"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("length", range(94, 101))
def test_the_echo_of_a_ctrl_c_after_a_redraw_never_leaves_a_line_of_the_live_region_behind(length):
    """The tty writes ``^C`` (two characters) where the cursor rests, after the live region's last
    line. Were that line to end one column before the edge, the ``C`` would wrap to a new line, the
    region's erase would miss its top line, and that line would stay above the reply's final text
    (seen once in a loaded suite: 19 words shown twice)."""
    import pyte

    words = [f"w{i}" for i in range(30)]
    while len(" ".join(words)) > length - 2:
        words.pop()
    words[-1] += "x" * (length - len(" ".join(words)))  # (one line, ending in column ``length``)
    text = " ".join(words)
    rendered = Tty()
    stream = MarkdownStream(TerminalConsole(file=rendered, force_terminal=True, color_system=None, width=100,
                                            height=30))
    stream.feed("first block\n\n" + text)
    rendered.write("^C")  # the tty's echo, where the cursor rests
    stream.close()
    screen = pyte.Screen(100, 30)
    pyte.Stream(screen).feed(rendered.getvalue().replace("\n", "\r\n"))
    shown = " ".join(screen.display).split()
    assert shown.count("block") == 1 and all(shown.count(word) <= 1 for word in words), screen.display
