"""Tools as solid as the rest: a result never pushes a request past the context window, nothing a
tool starts outlives its call, the tool process cannot be forged or handed a secret, whatever a
server sends (a key, a lone surrogate, a split name, calls nobody offered) is one line or one
result, and a session saved with tools says so when it is resumed without them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

import owned
from fakeserver import FakeServer, Reply, delta, sse
from localchat.cli.app import app
from localchat.tools.host import ToolHost
from localchat.tools.runner import ToolRunner, approve_all

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tools" / "add.py"
KEY = "sk-canary-" + "7" * 24


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def tool_file(tmp_path: Path, body: str, name: str = "tools.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def call_chunk(name: str, arguments: str, finish: str | None = "tool_calls", **extra) -> dict:
    return {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "x", "type": "function", "function": {
        "name": name, "arguments": arguments}}]}, "finish_reason": finish}], **extra}


def chat_calling_add(tools: Path, answer: str):
    """A chat whose (fake) model calls add(2, 3) once, then answers ``answer``; the run and the server."""
    server = FakeServer()
    server.chat([Reply(chunks=sse(call_chunk("add", '{"a": 2, "b": 3}'))), Reply(chunks=sse(delta(answer, "stop")))])
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--tools", str(tools),
                                   "--approve-tools", "What is 2 plus 3?"])
    finally:
        server.close()
    return done, server


def bodies(server: FakeServer) -> list[dict]:
    return [json.loads(b) for p, _, b in server.requests if p.endswith("completions")]


# --- 1. the context window holds, every round ------------------------------------------------------------

def sized_add(tmp_path: Path, words: int) -> Path:
    return tool_file(tmp_path, f'''
def add(a: int, b: int) -> str:
    """Add two whole numbers and return their sum.

    Args:
        a: the first number
        b: the second number
    """
    return str(a + b) + "\\n" + "lorem ipsum " * {words}
''', "big.py")


@pytest.mark.parametrize("windows", [1, 2, 20])
def test_a_tool_result_never_pushes_a_request_past_the_window_in_process(home, tmp_path, windows):
    """demo-tools has a 1024-token window; a result of 1, 2 and 20 windows is cut to what fits, said
    to the user and to the model, and no library warning reaches the terminal."""
    done = runner.invoke(app, ["chat", "-m", "demo-tools", "--tools", str(sized_add(tmp_path, 512 * windows)),
                               "--approve-tools", "--record", str(tmp_path / "r"), "What is 12 plus 30?"])
    assert done.exit_code in (0, 1) and "Traceback" not in done.stderr, done.stderr
    assert "Token indices sequence length" not in done.stderr
    responses = [json.loads(p.read_text()) for p in sorted((tmp_path / "r").glob("*-response.json"))]
    requests = [json.loads(p.read_text()) for p in sorted((tmp_path / "r").glob("*-request.json"))]
    assert len(responses) == 2  # the call, then the answer
    for response in responses:
        stats = response["stats"]
        assert stats["prompt_tokens"] <= stats["budget_tokens"] == 1024 - 64, stats
    sent = requests[1]["messages"][-1]
    assert sent["role"] == "tool" and "characters were cut here: they did not fit the model's context window" in \
        sent["content"]
    assert "add's result was cut from" in done.stderr and "the model is told so" in done.stderr
    assert "ctx 1" not in done.stderr.replace("ctx 100 %", "")  # never ctx 1xx % or more


def test_results_that_cannot_fit_even_cut_end_the_turn_in_one_line(home, tmp_path):
    done = runner.invoke(app, ["chat", "-m", "demo-tools", "--tools", str(sized_add(tmp_path, 10)), "--approve-tools",
                               "--max-context-tokens", "60", "--record", str(tmp_path / "r"), "What is 12 plus 30?"])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.exit_code == 1 and len(errors) == 1, done.stderr
    assert (
        "the tool results do not fit: even cut to nothing" in errors[0]
        and "over --max-context-tokens (60)" in errors[0]
    )
    assert done.stdout == ""
    assert len(list((tmp_path / "r").glob("*-request.json"))) == 1  # the next round was never sent


@pytest.fixture(scope="module")
def demo_tools_server(tmp_path_factory):
    from servers import serving

    with serving("demo-tools", tmp_path_factory.mktemp("server")) as server:
        yield server


def test_the_same_guard_holds_through_mlx_lm_server(home, tmp_path, demo_tools_server):
    done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", demo_tools_server.base_url, "-m",
                               "demo-tools", "--tools", str(sized_add(tmp_path, 5000)), "--approve-tools", "--record",
                               str(tmp_path / "r"), "What is 12 plus 30?"])
    assert "Traceback" not in done.stderr and "add's result was cut from" in done.stderr, done.stderr
    for response in sorted((tmp_path / "r").glob("*-response.json")):
        stats = json.loads(response.read_text())["stats"]
        assert stats["prompt_tokens"] <= stats["budget_tokens"], stats


def test_a_server_whose_window_is_unknown_refuses_in_its_own_words_in_one_line(home, tmp_path):
    server = FakeServer()
    refusal = Reply(400, [b'{"error": {"message": "This model\'s maximum context length is 4096 tokens"}}'],
                    {"Content-Type": "application/json"})
    server.chat([Reply(chunks=sse(call_chunk("add", '{"a": 2, "b": 3}'))), refusal])
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--tools",
                                   str(sized_add(tmp_path, 5000)), "--approve-tools", "What is 2 plus 3?"])
    finally:
        server.close()
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.exit_code == 1 and len(errors) == 1 and "maximum context length is 4096" in errors[0], done.stderr


# --- 3 and 14. nothing a tool starts outlives its call ------------------------------------------------------

def sleeper(tmp_path: Path, marker: str, then: str) -> Path:
    """``add`` starts ``sleep MARKER`` (a unique number) and then either waits or returns."""
    return tool_file(tmp_path, f'''
import subprocess, time

def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    subprocess.Popen(["sleep", "{marker}"])
    {then}
    return a + b
''')


def sleeping(marker: str) -> list[int]:
    return [p.pid for p in owned.owned(f"sleep {marker}")]


def wait_for(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_call_past_its_timeout_leaves_no_process_of_the_tools_group(tmp_path):
    marker = f"{371 + uuid.uuid4().int % 1000}.5"
    host = ToolHost([sleeper(tmp_path, marker, "time.sleep(60)")], timeout_s=1.5)
    try:
        done = ToolRunner([host], approve_all).run(__import__("localchat.backends", fromlist=["ToolCall"]).ToolCall(
            "abc123def", "add", '{"a": 1, "b": 2}'))
        assert done.status == "timeout" and "stopped, with every process it started" in done.content
        assert sleeping(marker) == []
    finally:
        host.close()


def test_what_a_call_leaves_running_is_stopped_when_it_returns_and_the_model_is_told(tmp_path):
    marker = f"{371 + uuid.uuid4().int % 1000}.25"
    host = ToolHost([sleeper(tmp_path, marker, "")], timeout_s=10)
    try:
        done = ToolRunner([host], approve_all).run(__import__("localchat.backends", fromlist=["ToolCall"]).ToolCall(
            "abc123def", "add", '{"a": 1, "b": 2}'))
        assert done.status == "ok" and done.content == "3\n[localchat stopped 1 process the tool left running]"
        assert sleeping(marker) == []
    finally:
        host.close()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_ctrl_c_sigterm_or_a_killed_chat_leave_no_process_a_tool_started(home, tmp_path, how):
    marker = f"{371 + uuid.uuid4().int % 1000}.75"
    server = FakeServer()
    server.chat(Reply(chunks=sse(call_chunk("add", '{"a": 2, "b": 3}'))))
    try:
        chat = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "localchat",
                "chat",
                "--backend",
                "server",
                "--base-url",
                server.base_url,
                "--tools",
                str(sleeper(tmp_path, marker, "time.sleep(60)")),
                "--approve-tools",
                "What is 2 plus 3?",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "LOCALCHAT_HOME": str(home)},
        )
        try:
            assert wait_for(lambda: sleeping(marker)), "the tool never started its process"
            chat.send_signal(getattr(signal, how))
            _, err = chat.communicate(timeout=30)
        finally:
            if chat.poll() is None:
                chat.kill()
    finally:
        server.close()
    assert chat.returncode == {"SIGINT": 130, "SIGTERM": 143, "SIGKILL": -9}[how], err
    assert wait_for(lambda: not sleeping(marker), 5.0), sleeping(marker)  # a killed chat: the worker's watchdog


# --- 10. a key never leaks; 12. the tool channel cannot be forged ------------------------------------------

ENVIRONMENT_TOOL = '''
import json, os

def add(a: int, b: int, note: str = "") -> str:
    """Add two whole numbers (and show the environment)."""
    return json.dumps(dict(os.environ))
'''


def test_a_canary_key_in_every_field_a_server_sends_appears_nowhere(home, tmp_path):
    echo = f"key={KEY}"
    server = FakeServer()
    first = Reply(
        chunks=sse(
            {"choices": [{"index": 0, "delta": {"reasoning": f"thinking {echo}"}}]},
            delta(f"let me see {echo} "),
            call_chunk("add", json.dumps({"a": 2, "b": 3, "note": echo})),
        )
    )
    second = Reply(chunks=sse(call_chunk(f"add{KEY}", '{"a": 1, "b": 1}')))
    third = Reply(chunks=sse(delta(f"The answer is 5, {echo}.", "stop")))
    fourth = Reply(400, [json.dumps({"error": {"message": f"bad request {echo}"}}).encode()],
                   {"Content-Type": "application/json"})
    server.chat([first, second, third, fourth])
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--tools",
                                   str(tool_file(tmp_path, ENVIRONMENT_TOOL)), "--approve-tools", "--record",
                                   str(tmp_path / "r"), "--max-tool-rounds", "3"],
                             input="What is 2 plus 3?\nAgain?\n",
                             env={"LOCALCHAT_API_KEY": KEY, "OPENAI_API_KEY": "sk-openai-" + "3" * 24,
                                  "ANTHROPIC_API_KEY": "sk-ant-" + "2" * 24, "HF_TOKEN": "hf_" + "1" * 30})
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    shown = done.stdout + done.stderr
    assert KEY not in shown and "[api key]" in shown
    for record in (tmp_path / "r").glob("*.json"):
        assert KEY not in record.read_text(), record.name
    for _path, _headers, body in server.requests:
        assert KEY not in body.decode()  # only in the Authorization header
    results = [m["content"] for b in bodies(server) for m in b["messages"] if m["role"] == "tool"]
    environment = json.loads(results[0])
    assert "LOCALCHAT_API_KEY" not in environment and KEY not in results[0]
    assert not {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "HF_TOKEN"} & set(environment)  # the keys localchat reads


@pytest.mark.parametrize("when", ["import", "call"])
@pytest.mark.parametrize("writes", ["b'not json\\n'", "b'[1, 2]\\n'", "b'{\"tools\": []}\\n'",
                                    "b'{\"ok\": true, \"seconds\": 0}\\n'"])
def test_a_tool_that_writes_to_the_channel_is_one_line_naming_its_file(home, tmp_path, when, writes):
    forge = f"""
import os
def _forge():
    for fd in range(3, 64):
        try:
            os.write(fd, {writes})
        except OSError:
            pass
"""
    body = forge + ("_forge()\n" if when == "import" else "") + f'''
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    {"_forge()" if when == "call" else "pass"}
    return a + b
'''
    done, server = chat_calling_add(tool_file(tmp_path, body, "forger.py"), "Done.")
    assert "Traceback" not in done.stderr, done.stderr
    if when == "import":
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.exit_code == 2 and len(errors) == 1 and "not its answer" in errors[0], done.stderr
        assert "forger.py" in errors[0]
    else:
        assert done.exit_code == 0 and "forger.py writes to localchat's channel" in done.stderr, done.stderr
        result = [m for m in bodies(server)[1]["messages"] if m["role"] == "tool"][0]["content"]
        assert result.startswith("error: the tool add: the tool process wrote something that is not its answer")


def test_a_tools_file_that_forks_at_import_announces_its_tools_once(home, tmp_path):
    path = tool_file(tmp_path, '''
import os, time
if os.fork() == 0:
    time.sleep(0.2)  # the child comes back into the worker a moment later

def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b
''')
    host = ToolHost([path], timeout_s=10)
    try:
        done = ToolRunner([host], approve_all).run(__import__("localchat.backends", fromlist=["ToolCall"]).ToolCall(
            "abc123def", "add", '{"a": 2, "b": 3}'))
        again = ToolRunner([host], approve_all).run(__import__("localchat.backends", fromlist=["ToolCall"]).ToolCall(
            "abc123def", "add", '{"a": 4, "b": 3}'))
    finally:
        host.close()
    assert [t["function"]["name"] for t in host.specs] == ["add"]
    assert (done.content, again.content) == ("5", "7")


def test_a_tool_that_reads_stdin_gets_nothing_and_the_next_call_still_arrives(tmp_path):
    path = tool_file(tmp_path, '''
import sys

def echo(text: str) -> str:
    """Read a line."""
    return repr(sys.stdin.readline()) + text
''')
    host = ToolHost([path], timeout_s=10)
    call = __import__("localchat.backends", fromlist=["ToolCall"]).ToolCall
    try:
        first = ToolRunner([host], approve_all).run(call("abc123def", "echo", '{"text": "a"}'))
        second = ToolRunner([host], approve_all).run(call("abc123def", "echo", '{"text": "b"}'))
    finally:
        host.close()
    assert (first.content, second.content) == ("''a", "''b")


def test_what_a_tool_prints_beside_its_result_is_shown_on_stderr_not_sent(home, tmp_path):
    path = tool_file(tmp_path, '''
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    print("adding", a, "and", b)
    return a + b
''')
    server = FakeServer()
    server.chat([Reply(chunks=sse(call_chunk("add", '{"a": 2, "b": 3}'))), Reply(chunks=sse(delta("5.", "stop")))])
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--tools", str(path),
                                   "--approve-tools", "What is 2 plus 3?"])
    finally:
        server.close()
    assert done.exit_code == 0 and "add printed (not sent to the model): adding 2 and 3" in done.stderr
    assert [m["content"] for m in bodies(server)[1]["messages"] if m["role"] == "tool"] == ["5"]


# --- 11, 15, 16. what a server sends ---------------------------------------------------------------------

def test_calls_from_a_server_that_was_offered_no_tools_are_never_an_answer(home):
    server = FakeServer()
    server.chat(Reply(chunks=sse(call_chunk("add", '{"a": 2, "b": 3}'))))
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url],
                             input="What is 2 plus 3?\n/save half\n/quit\n")
    finally:
        server.close()
    assert "the model answered with a call to add, but no tools are offered here" in done.stderr, done.stderr
    assert "saved 'half' (0 turns)" in done.stderr


def test_a_lone_surrogate_in_arguments_is_bad_arguments_the_model_hears(home):
    server = FakeServer()
    raw = (
        b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "x", "function": '
        b'{"name": "add", "arguments": "{\\"a\\": \\"\\\\ud800\\", \\"b\\": 3}"}}]}, "finish_reason": '
        b'"tool_calls"}]}\n\n'
    )
    server.chat([Reply(chunks=[raw, b"data: [DONE]\n\n"]), Reply(chunks=sse(delta("Sorry.", "stop")))])
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--tools",
                                   str(EXAMPLE), "--approve-tools", "What is 2 plus 3?"])
    finally:
        server.close()
    assert done.exit_code == 0 and done.stdout == "Sorry.\n", done.stderr
    result = [m for m in bodies(server)[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert "not valid Unicode (a lone surrogate" in result


def test_a_name_split_across_chunks_is_joined_and_a_huge_name_is_capped(home):
    pieces = [{"index": 0, "id": "x", "function": {"name": "ad", "arguments": '{"a": 2, '}},
              {"index": 0, "function": {"name": "d", "arguments": '"b": 3}'}}]
    split = Reply(
        chunks=sse(
            *[{"choices": [{"index": 0, "delta": {"tool_calls": [p]}, "finish_reason": None}]} for p in pieces],
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        )
    )
    huge = Reply(chunks=sse(call_chunk("x" * 200_000, "{}")))
    server = FakeServer()
    server.chat([split, huge, Reply(chunks=sse(delta("5.", "stop")))])
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--tools",
                                   str(EXAMPLE), "--approve-tools", "What is 2 plus 3?"])
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    results = [m["content"] for m in bodies(server)[-1]["messages"] if m["role"] == "tool"]
    assert results[0] == "5" and results[1].startswith("error: there is no tool named 'xxx") and len(results[1]) < 300
    assert max(len(line) for line in done.stderr.splitlines()) < 400


def test_a_filtered_reply_is_said_to_be_filtered_not_cut_at_max_tokens(home):
    server = FakeServer()
    server.chat(Reply(chunks=sse(delta("I cannot", "content_filter"))))
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "Hi"])
    finally:
        server.close()
    assert (
        "the server filtered the reply (finish_reason content_filter)" in done.stderr
        and "max-tokens" not in done.stderr
    )


# --- 4. resuming a session saved with tools -------------------------------------------------------------------

def test_resuming_a_tools_session_without_tools_says_so_and_never_accepts_a_call_as_an_answer(home):
    saved = runner.invoke(app, ["chat", "-m", "demo-tools", "--tools", str(EXAMPLE), "--approve-tools"],
                          input="What is 12 plus 30?\n/save tooltest\n/quit\n")
    assert saved.exit_code == 0 and "The answer is 42." in saved.stdout, saved.stderr
    resumed = runner.invoke(app, ["chat", "--resume", "tooltest"], input="What is 5 plus 9?\n/quit\n")
    assert "'tooltest' was saved with tool calls to add; no tools are offered now (add not offered: resume with " \
           "--tools FILE.py" in resumed.stderr, resumed.stderr
    assert "<tool_call>" not in resumed.stdout and "the model answered with a call to add" in resumed.stderr
    assert "still match" not in resumed.stderr or "but only" in resumed.stderr  # never "loaded … prefills only new"
    shown = runner.invoke(app, ["sessions", "show", "tooltest"]).stdout
    assert shown.count("user:") == 1  # the refused reply was not kept, nor saved on leaving
    again = runner.invoke(app, ["chat", "--resume", "tooltest", "--tools", str(EXAMPLE), "--approve-tools"],
                          input="What is 5 plus 9?\n/quit\n")
    assert "offered now: add" in again.stderr and "not offered" not in again.stderr


# --- 13. deep JSON in a saved session --------------------------------------------------------------------

@pytest.mark.parametrize("command", [["sessions", "show", "deep"], ["sessions", "export", "deep"],
                                     ["chat", "--resume", "deep", "Hi"]])
def test_a_saved_tool_step_nested_100000_deep_is_one_line_and_changes_nothing(home, command):
    import sqlite3

    first = runner.invoke(app, ["chat", "-m", "demo-tools", "--tools", str(EXAMPLE), "--approve-tools"],
                          input="What is 12 plus 30?\n/save deep\n/quit\n")
    assert first.exit_code == 0, first.stderr
    database = home / "sessions.sqlite3"
    with sqlite3.connect(database) as db:
        db.execute("UPDATE turns SET steps = ?", ("[" * 100_000 + "]" * 100_000,))
    before = database.read_bytes()
    done = runner.invoke(app, command)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.exit_code == 1 and len(errors) == 1 and "saved session 'deep' is damaged" in errors[0], done.stderr
    assert "Traceback" not in done.stderr and database.read_bytes() == before


# --- 5. standard input ---------------------------------------------------------------------------------------

def test_dash_reads_stdin_without_its_final_line_break(home):
    server = FakeServer()
    server.chat(Reply(chunks=sse(delta("5", "stop"))))
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "-"],
                             input="What is 2 plus 3?\n")
    finally:
        server.close()
    assert done.exit_code == 0
    assert bodies(server)[0]["messages"][-1]["content"] == "What is 2 plus 3?"


def test_a_result_with_a_lone_surrogate_goes_back_to_the_model_readable(home, tmp_path):
    tools = tool_file(tmp_path, 'def add(a: int, b: int) -> str:\n    """Add."""\n    return "sum \\ud800 " + str(a + '
                                'b)\n')
    done, server = chat_calling_add(tools, "Five.")
    assert done.exit_code == 0 and done.stdout == "Five.\n", done.stderr
    assert [m["content"] for m in bodies(server)[-1]["messages"] if m["role"] == "tool"] == ["sum \ufffd 5"]


def test_a_tool_file_with_ten_thousand_functions_is_refused_saying_so(home, tmp_path):
    body = "\n".join(f'def f{i}(a: int) -> int:\n    """F."""\n    return a\n' for i in range(10_000))
    done = runner.invoke(app, ["chat", "--tools", str(tool_file(tmp_path, body)), "Hi"])
    assert done.exit_code == 2 and "10,000 public functions, over the 128 tools a request can offer" in done.stderr
