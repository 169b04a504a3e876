"""MCP servers as tools: configured as LM Studio and Claude Desktop configure them, started in
parallel through the official SDK, called under the same approval, limits and history as Python
tools, and stopped with everything they started. Real servers (``mcp-server-time``, our own
``MCPServer`` add over stdio and Streamable HTTP) and hostile ones (``tests/hostile_mcp.py``)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
from typer.testing import CliRunner

import owned
from fakeserver import FakeServer, Reply, delta, sse
from localchat.cli.app import app
from localchat.server.launch import free_port

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ROOT / "tests" / "hostile_mcp.py"
ADD_SERVER = ROOT / "examples" / "mcp" / "add_server.py"
SERVER_SCRIPTS = ("hostile_mcp.py", "add_server.py", "mcp_server_time", "localchat.mcp.guard")


def left_behind() -> list[owned.Owned]:
    """This worker's MCP servers, their guards, and what the servers started (``sleep 3600``)."""
    return owned.owned(*SERVER_SCRIPTS, "sleep 3600")


@pytest.fixture(autouse=True)
def nothing_left():
    """After every test: none of the servers it started, nor anything they started, is alive."""
    yield
    deadline = time.monotonic() + 8
    while left_behind() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert owned.kill_owned(*SERVER_SCRIPTS, "sleep 3600") == []


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LOCALCHAT_API_KEY", raising=False)
    return tmp_path / "home"


def config(tmp_path: Path, servers: dict, name: str = "mcp.json") -> Path:
    """An mcpServers file; each stdio server gets the test run's mark in its ``env`` (localchat
    passes a server nothing else of its environment), so what it starts can be found as ours."""
    marked = {name: {**entry, "env": {**entry.get("env", {}), owned.MARK: owned.RUN}}
              if isinstance(entry, dict) and "command" in entry else entry for name, entry in servers.items()}
    path = tmp_path / name
    path.write_text(json.dumps({"mcpServers": marked}))
    return path


def hostile(mode: str, marker: Path | None = None) -> dict:
    return {"command": sys.executable, "args": [str(HOSTILE), mode, *([str(marker)] if marker else [])]}


def calls(*names_and_arguments: tuple[str, dict], answer: str = "Done.") -> list[Reply]:
    """A fake model that calls these tools, one a round, then answers."""
    rounds = [Reply(chunks=sse({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "x", "function": {
        "name": name, "arguments": json.dumps(arguments)}}]}, "finish_reason": "tool_calls"}]}))
        for name, arguments in names_and_arguments]
    return [*rounds, Reply(chunks=sse(delta(answer, "stop")))]


def chat_with(server: FakeServer, *args: str, prompt: str = "What is 2 plus 3?", **kwargs):
    return runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, *args, prompt], **kwargs)


def tool_results(server: FakeServer) -> list[str]:
    bodies = [json.loads(b) for p, _, b in server.requests if p.endswith("completions")]
    return [m["content"] for m in bodies[-1]["messages"] if m["role"] == "tool"] if bodies else []


# --- configuration ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "servers, extra, needle",
    [
        ({"a": {"command": "x", "colour": "red"}}, [], "server 'a': colour is not a key of a stdio server"),
        ({"a": {"command": ""}}, [], "server 'a': command must be a program to run"),
        ({"a": {"command": "x", "args": "y"}}, [], "server 'a': args must be a list of strings"),
        ({"a": {"command": "x", "env": {"K": 1}}}, [], "server 'a': env must be an object of strings"),
        ({"a": {"url": "ftp://host/mcp"}}, [], "server 'a': url must be an http:// or https:// URL, not ftp://"),
        ({"a": {"url": "http://u:p@host/mcp"}}, [], "server 'a': url holds credentials"),
        (
            {"a": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer ${NO_SUCH_TOKEN_HERE}"}}},
            [],
            "server 'a': headers.Authorization uses ${NO_SUCH_TOKEN_HERE}, which is not set",
        ),
        ({"a": {"command": "x", "cwd": "/no/such/dir"}}, [], "server 'a': cwd is not a directory"),
        ({"a": {"command": "x", "type": "ftp"}}, [], "server 'a': type must be stdio, http or sse"),
        ({"a": {"command": "x", "type": "sse"}}, [], "server 'a': command is not a key of an http server"),
        ({"a": "x"}, [], "server 'a': its entry must be an object"),
        ({}, [], "mcpServers is empty"),
        (
            {"a": {"command": "x"}},
            ["--mcp-only", "b"],
            "--mcp-only b: no such server in the --mcp files (they configure: a)",
        ),
        ({"a": {"command": "x"}}, ["--mcp-only", ","], "--mcp-only"),
    ],
)
def test_a_bad_configuration_is_one_line_naming_the_server_and_key_exit_2(home, tmp_path, servers, extra, needle):
    done = runner.invoke(app, ["chat", "--mcp", str(config(tmp_path, servers)), *extra, "Hi"])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.exit_code == 2 and len(errors) == 1 and needle in errors[0], done.stderr
    assert "Traceback" not in done.stderr and not home.exists()


@pytest.mark.parametrize("text, needle", [
    ("{not json", "not JSON"), ("[" * 100_000 + "]" * 100_000, "nested more than 128 levels"),
    ('{"servers": {}}', "servers is empty"), ('{"tools": {}}', "no mcpServers (or VS Code's servers) in the file"),
    (None, "no such file"),
])
def test_a_file_that_is_not_a_configuration_is_one_line(home, tmp_path, text, needle):
    path = tmp_path / "mcp.json"
    if text is not None:
        path.write_text(text)
    done = runner.invoke(app, ["chat", "--mcp", str(path), "Hi"])
    assert done.exit_code == 2 and needle in done.stderr and "Traceback" not in done.stderr


def test_the_same_server_in_two_files_and_mcp_only_without_mcp_are_refused(home, tmp_path):
    first, second = (
        config(tmp_path, {"a": {"command": "x"}}, "1.json"),
        config(tmp_path, {"a": {"command": "y"}}, "2.json"),
    )
    twice = runner.invoke(app, ["chat", "--mcp", str(first), "--mcp", str(second), "Hi"])
    assert twice.exit_code == 2 and "server 'a' is already configured in another --mcp file" in twice.stderr
    alone = runner.invoke(app, ["chat", "--mcp-only", "a", "Hi"])
    assert alone.exit_code == 2 and "--mcp-only picks servers of --mcp FILE" in alone.stderr


def test_variables_are_read_from_the_environment_and_the_server_gets_only_its_own(home, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_API_KEY", "sk-canary-" + "9" * 20)
    monkeypatch.setenv("MY_TOKEN", "t0k3n")
    monkeypatch.setenv("UNRELATED_SECRET", "s3cr3t")
    path = config(tmp_path, {"h": {**hostile("env"), "env": {"TOKEN": "${MY_TOKEN}", "PLAIN": "p"}}})
    server = FakeServer()
    server.chat(calls(("h_add", {"a": 2, "b": 3})))
    try:
        done = chat_with(server, "--mcp", str(path), "--approve-tools")
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    environment = json.loads(tool_results(server)[0])
    assert environment["TOKEN"] == "t0k3n" and environment["PLAIN"] == "p"
    assert set(environment) <= {"PATH", "HOME", "LANG", "TMPDIR", "TOKEN", "PLAIN", owned.MARK}, sorted(environment)
    assert "a line on stderr" not in done.stderr  # a server's stderr goes to its log, never the terminal
    logs = list((home / "logs").glob("mcp-h-*.log"))
    assert len(logs) == 1 and "a line on stderr, for the log only" in logs[0].read_text()
    assert stat.S_IMODE(logs[0].stat().st_mode) == 0o600 and stat.S_IMODE((home / "logs").stat().st_mode) == 0o700


# --- real servers ----------------------------------------------------------------------------------------------

def test_mcp_server_time_lists_its_tools_in_slash_mcp_and_answers_a_call(home, tmp_path):
    path = config(tmp_path, {"time": {"command": sys.executable, "args": ["-m", "mcp_server_time"]}})
    server = FakeServer()
    server.chat(calls(("time_get_current_time", {"timezone": "Europe/Paris"}), answer="It is late."))
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--mcp", str(path),
                                   "--approve-tools"], input="/mcp\n/tools\nWhat time is it in Paris?\n/quit\n")
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    assert "tools offered: time_get_current_time, time_convert_time" in done.stderr
    assert "time: ready · 2 tools · pid " in done.stderr and "mcp-time-" in done.stderr
    assert "time_get_current_time(timezone: string) — Get current time in a specific timezone [MCP server time; " \
           "runs without asking (--approve-tools)]" in done.stderr
    assert '"timezone": "Europe/Paris"' in tool_results(server)[0] and "It is late." in done.stdout


@contextmanager
def add_over(transport: str):
    """Our add server over HTTP: Streamable HTTP (``http``) or the older HTTP+SSE (``sse``)."""
    import httpx

    port = free_port()
    process = subprocess.Popen([sys.executable, str(ADD_SERVER), f"--{transport}", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/{'mcp' if transport == 'http' else 'sse'}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None and time.monotonic() < deadline, f"the add server did not start ({transport})"
            try:
                httpx.head(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield {"url": url} if transport == "http" else {"type": "sse", "url": url}
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.mark.parametrize("transport", ["stdio", "http", "sse"])
def test_our_add_server_is_called_over_stdio_streamable_http_and_sse(home, tmp_path, transport):
    stdio = {"command": sys.executable, "args": [str(ADD_SERVER)]}
    server = FakeServer()
    server.chat(calls(("math_add", {"a": 12, "b": 30}), answer="The answer is 42."))
    try:
        with nullcontext(stdio) if transport == "stdio" else add_over(transport) as entry:
            done = chat_with(server, "--mcp", str(config(tmp_path, {"math": entry})), "--approve-tools", "--record",
                             str(tmp_path / "r"), prompt="What is 12 plus 30?")
    finally:
        server.close()
    assert done.exit_code == 0 and done.stdout == "The answer is 42.\n", done.stderr
    assert tool_results(server) == ["42"] and '→ math_add({"a": 12, "b": 30})' in done.stderr
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "r").glob("*-response.json"))]
    assert records[0]["tool_calls"][0]["name"] == "math_add"
    if transport == "stdio":  # the call ran in the server's own process: its stderr says so, in its log
        assert "add(12, 30) = 42" in next((home / "logs").glob("mcp-math-*.log")).read_text()


def test_python_tools_and_mcp_tools_are_offered_together_and_a_taken_name_is_said(home, tmp_path):
    tools = tmp_path / "tools.py"
    tools.write_text('def math_add(a: int, b: int) -> int:\n    """Add."""\n    return a + b\n\n'
                     'def mul(a: int, b: int) -> int:\n    """Multiply."""\n    return a * b\n')
    path = config(tmp_path, {"math": {"command": sys.executable, "args": [str(ADD_SERVER)]}})
    server = FakeServer()
    server.chat(calls(("mul", {"a": 6, "b": 7})))
    try:
        done = chat_with(server, "--tools", str(tools), "--mcp", str(path), "--approve-tools")
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    assert "tool 'add' would be offered as math_add, which is taken: it is left out" in done.stderr
    assert tool_results(server) == ["42"]


# --- hostile servers -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, needle", [
    ("silent", "did not answer initialize and tools/list within 2s (--mcp-timeout)"),
    ("garbage", "it sent something that is not JSON-RPC: 'this is not JSON-RPC {'"),
    ("no-such-program", "it ended before it answered; its stderr says: cannot start"),
])
def test_a_server_that_does_not_start_is_one_line_and_the_chat_goes_on(home, tmp_path, mode, needle):
    entry = {"command": "/no/such/program"} if mode == "no-such-program" else hostile(mode)
    server = FakeServer()
    server.chat(Reply(chunks=sse(delta("Five.", "stop"))))
    started = time.monotonic()
    try:
        # the silent one is given up on after 2 s; the others must be told apart by what they do, which on a
        # busy machine can come after 2 s (the hostile server imports the mcp SDK before it reads a line)
        timeout = "2" if mode == "silent" else "15"
        done = chat_with(server, "--mcp", str(config(tmp_path, {"h": entry})), "--mcp-timeout", timeout,
                         "--approve-tools")
    finally:
        server.close()
    assert done.exit_code == 0 and done.stdout == "Five.\n", done.stderr
    notices = [line for line in done.stderr.splitlines() if "MCP server 'h' did not start" in line]
    assert len(notices) == 1 and needle in notices[0] and "the chat goes on without its tools" in notices[0]
    assert "Traceback" not in done.stderr and time.monotonic() - started < 20


def test_a_server_that_dies_in_a_call_is_an_error_result_started_again_once_then_down(home, tmp_path):
    server = FakeServer()
    server.chat(calls(("h_add", {"a": 1, "b": 1}), ("h_add", {"a": 2, "b": 2}), ("h_add", {"a": 3, "b": 3})))
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--mcp",
                                   str(config(tmp_path, {"h": hostile("dies")})), "--approve-tools"],
                             input="Add them.\n/mcp\n/quit\n")
    finally:
        server.close()
    results = tool_results(server)
    assert done.exit_code == 0 and len(results) == 3, done.stderr
    assert "ended during the call (it is started again once" in results[0]
    assert "ended during the call" in results[1]  # started again, and died again
    assert "cannot take calls" in results[2]
    assert "h: down · 1 tool" in done.stderr


def test_a_thousand_tools_a_ten_megabyte_result_and_escape_sequences(home, tmp_path):
    path = config(tmp_path, {"many": hostile("many"), "huge": hostile("huge"), "esc": hostile("escapes"),
                             "odd": hostile("not-object")})
    server = FakeServer()
    server.chat(calls(("huge_add", {"a": 1, "b": 2}), ("esc_add__0_pwned___2J__31m", {"a": 2, "b": 3}),
                      ("odd_add", {"a": 3, "b": 4})))
    started = time.monotonic()
    try:
        done = chat_with(server, "--mcp", str(path), "--approve-tools", "--mcp-only", "huge,esc,odd,many")
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    assert time.monotonic() - started < 60  # the servers started in parallel
    assert "more than 128 tools in all; the rest are left out" in done.stderr
    assert "tool 'listy' is left out: its input schema is not an object schema (type 'array')" in done.stderr
    assert "tool 'broken' is left out: its input schema is invalid" in done.stderr
    huge, escaped, odd = tool_results(server)
    assert len(huge) < 17_000 and "more characters cut" in huge
    assert escaped == "\x1b]0;pwned\x07\x1b[2J\x1b[31m5"  # the model gets the exact text
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr  # a terminal never does
    assert odd == "7"


def test_a_schema_pattern_that_backtracks_costs_a_call_seconds_not_hours(home, tmp_path):
    path = config(tmp_path, {"bt": hostile("backtracks")})
    server = FakeServer()
    server.chat(calls(("bt_echo", {"code": "a" * 40 + "!"}), ("bt_echo", {"code": "aaa"}), ("bt_echo", {"code": "b"})))
    started = time.monotonic()
    try:
        done = chat_with(server, "--mcp", str(path), "--approve-tools")
    finally:
        server.close()
    assert done.exit_code == 0 and time.monotonic() - started < 40, done.stderr
    slow, fits, wrong = tool_results(server)
    assert slow.startswith("error: testing the arguments against bt_echo's parameters took over 2 s"), slow
    assert fits == "aaa"
    assert wrong.startswith("error: the arguments do not fit bt_echo's parameters (code: 'b' does not")


def test_a_call_past_the_tool_timeout_is_cancelled_and_the_server_hears_it(home, tmp_path):
    marker = tmp_path / "heard"
    server = FakeServer()
    server.chat(calls(("h_add", {"a": 1, "b": 2})))
    try:
        done = chat_with(server, "--mcp", str(config(tmp_path, {"h": hostile("slow", marker)})), "--approve-tools",
                         "--tool-timeout", "1.5")
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    assert "did not finish within 1.5s (--tool-timeout); the call was cancelled" in tool_results(server)[0]
    assert marker.read_text() == "cancelled"  # notifications/cancelled reached the server


def test_a_server_that_forks_and_ignores_sigterm_leaves_nothing_when_the_chat_ends(home, tmp_path):
    server = FakeServer()
    server.chat(calls(("h_add", {"a": 1, "b": 2})))
    try:
        done = chat_with(server, "--mcp", str(config(tmp_path, {"h": hostile("stubborn", tmp_path / "pid")})),
                         "--approve-tools")
    finally:
        server.close()
    assert done.exit_code == 0 and tool_results(server) == ["3"], done.stderr
    # the autouse fixture checks: neither the server nor its two `sleep 3600` are left


def test_a_changed_tool_list_is_offered_before_the_next_round(home, tmp_path):
    server = FakeServer()
    server.chat(calls(("h_add", {"a": 5, "b": 3}), ("h_subtract", {"a": 5, "b": 3})))
    try:
        done = chat_with(server, "--mcp", str(config(tmp_path, {"h": hostile("list-changed")})), "--approve-tools")
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    assert tool_results(server) == ["8", "2"]
    bodies = [json.loads(b) for p, _, b in server.requests if p.endswith("completions")]
    assert [t["function"]["name"] for t in bodies[0]["tools"]] == ["h_add"]
    assert [t["function"]["name"] for t in bodies[1]["tools"]] == ["h_add", "h_subtract"]


@pytest.mark.parametrize("mode", ["slow-start", "slow"])
def test_ctrl_c_during_start_up_or_a_call_is_130_and_leaves_no_server(home, tmp_path, mode):
    marker = tmp_path / "marker"
    fake = FakeServer()
    fake.chat(calls(("h_add", {"a": 1, "b": 2})))
    try:
        chat = subprocess.Popen([sys.executable, "-m", "localchat", "chat", "--backend", "server", "--base-url",
                                 fake.base_url, "--mcp", str(config(tmp_path, {"h": hostile(mode, marker)})),
                                 "--approve-tools", "What is 1 plus 2?"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "LOCALCHAT_HOME": str(home)})
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if (mode == "slow-start" and marker.exists()) or \
                        (mode == "slow" and any(p.endswith("completions") for p, _, _ in fake.requests)):
                    break
                time.sleep(0.1)
            time.sleep(0.5)
            chat.send_signal(signal.SIGINT)
            _, err = chat.communicate(timeout=30)
        finally:
            if chat.poll() is None:
                chat.kill()
    finally:
        fake.close()
    assert chat.returncode == 130 and "interrupted" in err and "Traceback" not in err, err


@pytest.mark.parametrize("mode", ["stubborn", "setsid"] if sys.platform == "linux" else ["stubborn"])
def test_a_server_killed_with_the_chat_leaves_nothing(home, tmp_path, mode):
    """Whatever kills the chat (SIGKILL here), each server's guard takes its group with it, and on
    Linux (a subreaper) what the server started in a session of its own."""
    marker = tmp_path / "pid"
    fake = FakeServer()
    fake.chat(Reply(chunks=sse(delta("x", None)), pause_s=30))
    try:
        chat = subprocess.Popen([sys.executable, "-m", "localchat", "chat", "--backend", "server", "--base-url",
                                 fake.base_url, "--mcp", str(config(tmp_path, {"h": hostile(mode, marker)})),
                                 "--approve-tools", "Hi"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "LOCALCHAT_HOME": str(home)})
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        chat.kill()
        chat.wait()
    finally:
        fake.close()
    # the autouse fixture checks that the server and its children are gone within seconds; its pid file goes too
    deadline = time.monotonic() + 8
    while list((home / "logs").glob("mcp-*.pid")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list((home / "logs").glob("mcp-*.pid")) == []


# --- everywhere tools go -------------------------------------------------------------------------------------

def test_a_session_saved_with_mcp_tools_says_so_when_resumed_without_them(home, tmp_path):
    path = config(tmp_path, {"math": {"command": sys.executable, "args": [str(ADD_SERVER)]}})
    server = FakeServer()
    server.chat(calls(("math_add", {"a": 12, "b": 30}), answer="42."))
    try:
        saved = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--mcp", str(path),
                                    "--approve-tools"], input="What is 12 plus 30?\n/save sums\n/quit\n")
        server.chat(Reply(chunks=sse(delta("Hello.", "stop"))))
        resumed = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--resume", "sums"],
                                input="/quit\n")
    finally:
        server.close()
    assert saved.exit_code == 0 and "saved 'sums' (1 turn)" in saved.stderr, saved.stderr
    assert "'sums' was saved with tool calls to math_add; no tools are offered now" in resumed.stderr


def test_bench_runs_mcp_tools_unattended_only_with_approve_tools(home, tmp_path):
    script = tmp_path / "sums.yaml"
    script.write_text("name: sums\nconversations:\n  - turns:\n      - user: What is 2 plus 3?\n")
    path = config(tmp_path, {"math": {"command": sys.executable, "args": [str(ADD_SERVER)]}})
    server = FakeServer()
    server.chat(lambda body: calls(("math_add", {"a": 2, "b": 3}))[1 if body["messages"][-1]["role"] == "tool" else 0])
    try:
        refused = runner.invoke(app, ["bench", "-m", "demo-tools", "--backend", "server", "--base-url", server.base_url,
                                      "--mcp", str(path), "--script", str(script)])
        bench = runner.invoke(app, ["bench", "-m", "demo-tools", "--backend", "server", "--base-url", server.base_url,
                                    "--mcp", str(path), "--approve-tools", "--history", "on", "--script", str(script)])
    finally:
        server.close()
    assert refused.exit_code == 2 and "needs --approve-tools" in refused.stderr
    assert bench.exit_code == 0 and "tools: 1 calls in 1 rounds" in " ".join(bench.stdout.split()), bench.stderr


# --- the issue's own command: demo-tools calls add in a real MCP server process ---------------------------

@pytest.fixture(scope="module")
def demo_tools_server(tmp_path_factory):
    from servers import serving

    with serving("demo-tools", tmp_path_factory.mktemp("server")) as server:
        yield server


@pytest.mark.parametrize("backend", ["inproc", "server"])
def test_demo_tools_calls_add_in_the_example_mcp_server_and_answers_42(home, monkeypatch, backend, request):
    monkeypatch.chdir(ROOT)  # examples/mcp/add.json names its server's script relative to the checkout
    where = ["--backend", "server", "--base-url", request.getfixturevalue("demo_tools_server").base_url] \
        if backend == "server" else []
    done = runner.invoke(app, ["chat", "-m", "demo-tools", *where, "--mcp", "examples/mcp/add.json", "--approve-tools",
                               "What is 12 plus 30?"])
    assert done.exit_code == 0 and done.stdout == "The answer is 42.\n", done.stderr
    assert '→ math_add({"a": 12, "b": 30})' in done.stderr and "← 42" in done.stderr
    assert "add(12, 30) = 42" in next((home / "logs").glob("mcp-math-*.log")).read_text()  # ran in the server
