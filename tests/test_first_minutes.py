"""What a new user meets in the first minutes: Ctrl+C at the prompt, leaving with unsaved turns,
smoke's TTFT on the chat's clock, line breaks kept by Markdown, a spinner before the first token,
/retry saying what it kept, keys typed during a reply, bench and load at 80 columns, the plots,
and the small things (sessions show, serve's last line, the KV cache's group size)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import matplotlib
import pexpect
from typer.testing import CliRunner

from fakeserver import GOOD, USAGE, FakeServer, Reply, delta, sse
from localchat.cli.app import app
from localchat.plots import finish_figure
from pty_chat import PROMPT, quit, spawn

matplotlib.use("Agg")
runner = CliRunner()
REMEMBER = "Remember the code harbor 17. Reply only OK."


def turn(child: pexpect.spawn, line: str) -> None:
    child.send(line + "\r")
    child.expect_exact("[TTFT")
    child.expect_exact(PROMPT)


def test_ctrl_c_at_the_prompt_clears_the_line_and_leaving_unsaved_turns_is_said(tmp_path):
    child = spawn("--no-log", home=tmp_path)  # kept as it happens, nothing is unsaved: --no-log asks
    turn(child, REMEMBER)
    child.send("half typed")
    child.sendintr()
    child.expect_exact("(Ctrl+C clears the line; /quit or Ctrl+D leaves)")
    child.expect_exact(PROMPT)
    child.send("/quit\r")
    child.expect_exact("1 turn not saved: /save NAME keeps them")
    child.expect_exact(PROMPT)
    child.send("/save mine\r")
    child.expect_exact("saved 'mine' (1 turn)")
    child.expect_exact(PROMPT)
    child.send("/quit\r")  # saved now: it leaves at once
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    child = spawn("--no-log", home=tmp_path)
    turn(child, "Hello")
    child.sendeof()
    child.expect_exact("1 turn not saved")
    child.expect_exact(PROMPT)
    child.sendeof()  # a second time leaves without saving
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_script_leaves_at_once_saying_what_was_not_saved(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    result = runner.invoke(app, ["chat", "--no-log"], input="Hello\n/quit\n")
    assert result.exit_code == 0 and "left without saving 1 turn" in result.stderr
    kept = runner.invoke(app, ["chat"], input="Hello\n/quit\n")
    assert kept.exit_code == 0 and "left without saving" not in kept.stderr and "(1 turn)" in kept.stderr
    assert "continue later with: " in kept.stderr and "localchat chat --continue" in kept.stderr


def test_smoke_times_the_stream_on_the_chats_clock(tmp_path):
    """The first streamed chunk comes 0.8 s after the request: smoke's TTFT is that, not that plus
    loading the model's tokenizer (which it now does before the clock starts)."""
    delay = 0.8
    server = FakeServer()
    completion = Reply(200, [json.dumps({"choices": [{"message": {"role": "assistant", "content": "Hi"},
                                                      "finish_reason": "stop"}], "usage": USAGE}).encode()],
                       {"Content-Type": "application/json"})
    streamed = Reply(chunks=[b"".join(GOOD)], pause_s=delay)
    server.chat([completion, streamed, Reply(chunks=sse(delta("OK", "stop"), {"choices": [], "usage": USAGE})),
                 Reply(chunks=sse(delta("harbor 17", "stop"), {"choices": [], "usage": USAGE}))])
    server.replies["/health"] = Reply(200, [b"OK"], {"Content-Type": "text/plain"})
    server.replies["/v1/models"] = Reply(200, [b'{"data": [{"id": "demo"}]}'], {"Content-Type": "application/json"})
    try:
        done = subprocess.run([sys.executable, "-m", "localchat", "smoke", "--base-url", server.base_url, "-m",
                               "demo", "--json"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "LOCALCHAT_HOME": str(tmp_path)})
    finally:
        server.close()
    report = json.loads(done.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    streaming = checks["streaming + usage"]
    ttft = float(re.search(r"TTFT ([\d.]+)s", streaming["detail"])[1])
    assert delay <= ttft < delay + 0.4, streaming["detail"]
    assert streaming["seconds"] < delay + 0.6  # the check itself is the stream, not a set-up
    assert checks["/v1/models"]["detail"] == "HTTP 200, 1 model listed"


POEM = "Roses are red,\nViolets are blue,\nSugar is **sweet**.\n\n```\ncode\n```\n"


def test_markdown_keeps_the_models_line_breaks_and_waits_with_a_spinner(tmp_path):
    server = FakeServer()
    server.chat(Reply(chunks=[b"".join(sse(delta(POEM, "stop")))], pause_s=1.5))
    try:
        child = spawn("--backend", "server", "--base-url", server.base_url, home=tmp_path, color=True)
        child.send("A poem\r")
        child.expect_exact("waiting for the first token")  # on the terminal, before anything arrives
        child.expect_exact("Roses are red,")
        child.expect_exact("[TTFT")
        shown = child.before
        assert re.search(r"Roses are red,[^\n]*\r\n[^\n]*Violets are blue,[^\n]*\r\n[^\n]*Sugar is", shown), shown
        assert "**" not in shown and "```" not in shown  # still Markdown: emphasis and the code block
        child.expect_exact(PROMPT)
        quit(child)
        piped = subprocess.run([sys.executable, "-m", "localchat", "chat", "--backend", "server", "--base-url",
                                server.base_url, "A poem"], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "LOCALCHAT_HOME": str(tmp_path)})
    finally:
        server.close()
    assert piped.stdout == POEM + "\n" and "waiting" not in piped.stderr  # never on pipes


def test_retry_says_what_it_kept_and_keys_typed_during_a_reply_are_dropped(tmp_path):
    server = FakeServer()
    slow = Reply(chunks=sse(*[delta(f"word{i} ") for i in range(12)], delta("end", "stop")), pause_s=0.15)
    server.chat(slow)
    try:
        child = spawn("--backend", "server", "--base-url", server.base_url, home=tmp_path)
        child.send("hello\r")
        time.sleep(0.8)  # the reply streams
        child.send("/reset\r")  # typed ahead: neither echoed above the answer nor run afterwards
        child.expect_exact("[TTFT")
        assert "/reset" not in child.before
        child.expect_exact("dropped what was typed while the reply streamed (7 bytes)")
        child.expect_exact(PROMPT)
        child.send("/history\r")
        child.expect_exact("history: 2 messages")  # /reset never ran
        child.expect_exact(PROMPT)
        child.send("/retry\r")
        child.expect_exact("the new answer replaced the old one, which is gone (/undo would remove this whole turn)")
        child.expect_exact(PROMPT)
        child.send("/set max_tokens 1\r")
        child.expect_exact(PROMPT)
        server.chat(Reply(chunks=sse(delta("cut", "length"))))
        child.send("/retry\r")
        child.expect_exact("kept the old answer: the new one was not kept")
        child.expect_exact(PROMPT)
        quit(child)
    finally:
        server.close()


def test_retry_with_nothing_to_retry_stops_the_spinner_and_keys_without_enter_are_said(tmp_path):
    server = FakeServer()
    server.chat(Reply(chunks=sse(*[delta(f"word{i} ") for i in range(12)], delta("end", "stop")), pause_s=0.15))
    try:
        child = spawn("--backend", "server", "--base-url", server.base_url, home=tmp_path)
        child.send("/retry\r")
        child.expect_exact("error: nothing to retry: no question has been answered and kept yet")
        child.expect_exact(PROMPT)
        time.sleep(0.6)  # a spinner left running would draw over the prompt by now
        child.send("/stats\r")
        child.expect_exact("turns 0 ")
        child.expect_exact(PROMPT)
        assert "waiting for the first token" not in child.before
        child.send("hello\r")
        time.sleep(0.8)
        child.send("abc")  # typed during the reply, no Enter
        child.expect_exact("[TTFT")
        child.expect_exact("dropped what was typed while the reply streamed (3 bytes)")
        child.expect_exact(PROMPT)
        child.send("/set\r")
        child.expect_exact("repetition_penalty off")
        child.expect_exact("system none")
        child.expect_exact(PROMPT)
        child.send("/set foo 1\r")
        child.expect_exact("unknown setting 'foo': one of temperature, top_p, top_k, min_p, repetition_penalty, "
                            "max_tokens, system")
        child.expect_exact(PROMPT)
        child.send("/stats\r")
        child.expect_exact("turns 1 ")
        child.expect_exact("TTFT mean ")
        child.expect_exact(PROMPT)
        assert "–s" not in child.before
        quit(child)
    finally:
        server.close()


def test_bench_and_load_at_80_columns_wrap_between_figures_and_say_things_right(tmp_path):
    bench = runner.invoke(app, ["bench", "--repeat", "1", "--max-tokens", "24"], env={"COLUMNS": "80"})
    assert bench.exit_code == 0, bench.stderr
    lines = bench.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert "think" not in bench.stdout and "TTFA" not in bench.stdout  # the demo does not think
    assert re.search(r"accuracy [+-]\d+ points", bench.stdout)

    server = FakeServer()
    server.chat(Reply(chunks=GOOD))
    try:
        load = runner.invoke(app, ["load", "--base-url", server.base_url, "--sweep", "1,2", "--conversations", "1",
                                   "--warmup", "0", "--out", str(tmp_path / "load")], env={"COLUMNS": "80"})
    finally:
        server.close()
    assert load.exit_code == 0, load.stdout + load.stderr
    lines = load.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert "1 users" not in load.stdout and "1 user" in load.stdout
    assert "goodput" not in load.stdout  # no SLO was given: every request would be "good"


def test_plot_titles_are_whole_and_axes_start_at_zero():
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax in axes:
        ax.plot([1, 2], [5, 6], label="x")
    title = "localchat bench · " + "a long environment line, " * 12 + "max tokens 64, 2026-12-03"
    finish_figure(fig, axes, title)
    assert fig._suptitle.get_text().replace("\n", " ") == title  # wrapped, never cut
    assert all(ax.get_ylim()[0] == 0 for ax in axes)
    plt.close(fig)


def test_sessions_show_lists_pins_and_the_kv_group_size_is_chosen(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    saved = runner.invoke(app, ["chat", "--pin", "the user is Mei"], input=f"{REMEMBER}\n/save p\n/quit\n")
    assert saved.exit_code == 0, saved.stderr
    shown = runner.invoke(app, ["sessions", "show", "p"])
    assert "pin 1: the user is Mei" in shown.stdout
    missing = runner.invoke(app, ["sessions", "rm", "nope"])
    assert missing.exit_code == 1 and "no saved session named 'nope'" in missing.stderr


def test_ctrl_c_on_serve_says_it_stopped_the_server_not_an_exit_code(tmp_path):
    from localchat.server.launch import free_port

    proc = subprocess.Popen([sys.executable, "-m", "localchat", "serve", "--port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "LOCALCHAT_HOME": str(tmp_path)})
    deadline = time.monotonic() + 120
    output = ""
    while "Ctrl+C stops the server" not in output and time.monotonic() < deadline:
        output += proc.stdout.readline()
    proc.send_signal(2)
    output += proc.communicate(timeout=30)[0]
    assert proc.returncode == 0 and "server stopped" in output and "exit code" not in output, output


def test_the_load_plot_gives_each_history_setting_one_colour_in_both_panels(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)  # keep the figure to look at it
    server = FakeServer()
    server.chat(Reply(chunks=GOOD))
    try:
        done = runner.invoke(app, ["load", "--base-url", server.base_url, "--sweep", "1,2", "--conversations", "1",
                                   "--warmup", "0", "--plot", str(tmp_path / "load.png")])
    finally:
        server.close()
    assert done.exit_code == 0, done.stdout + done.stderr
    throughput, ttft = kept[0].axes
    colours = {line.get_label(): line.get_color() for ax in (throughput, ttft) for line in ax.get_lines()}
    assert colours["history on"] == colours["history on p50"] == colours["history on p99"]
    assert colours["history off"] == colours["history off p50"] == colours["history off p99"]
    assert colours["history on"] != colours["history off"]
    assert throughput.get_ylim()[0] == 0 and ttft.get_ylim()[0] == 0
    assert "…" not in kept[0]._suptitle.get_text() and (tmp_path / "load.png").stat().st_size > 0
