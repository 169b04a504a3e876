"""The MCP files users already have, read unchanged: Claude Desktop's (other top-level keys),
VS Code's (``servers``, ``inputs``), Cursor's and Cline's (``disabled``, ``autoApprove``), Roo's
(``alwaysAllow``), Claude Code's ``${VAR:-default}``; and a server that fails to start names its
real error and its log."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import owned
from fakeserver import FakeServer, Reply, delta, sse
from localchat.cli.app import app
from localchat.errors import UsageError
from localchat.mcp.config import read_configs

runner = CliRunner()
ADD_SERVER = Path(__file__).resolve().parents[1] / "examples" / "mcp" / "add_server.py"
ADD = {"command": sys.executable, "args": [str(ADD_SERVER)], "env": {owned.MARK: owned.RUN}}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def written(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(data))
    return path


def read(tmp_path: Path, data: dict):
    notes: list[str] = []
    return read_configs((written(tmp_path, data),), notes=notes), notes


def test_claude_desktop_s_other_keys_are_ignored_and_named_once(tmp_path):
    servers, notes = read(tmp_path, {"globalShortcut": "Ctrl+Space", "mcpServers": {"math": ADD},
                                     "preferences": {"x": 1}})
    assert [s.name for s in servers] == ["math"]
    assert len(notes) == 1 and "ignored globalShortcut, preferences (not MCP servers)" in notes[0]


def test_vs_code_s_servers_are_read_and_an_input_is_refused_in_one_line(tmp_path):
    servers, notes = read(tmp_path, {"servers": {"math": {"type": "stdio", **ADD}},
                                     "inputs": [{"type": "promptString", "id": "key", "password": True}]})
    assert [s.name for s in servers] == ["math"] and "ignored inputs" in notes[0]
    with pytest.raises(UsageError, match=r"server 'gh': env.TOKEN uses \$\{input:key\}, a value VS Code prompts for"):
        read(tmp_path, {"servers": {"gh": {**ADD, "env": {"TOKEN": "${input:key}"}}}, "inputs": [{"id": "key"}]})


def test_disabled_servers_are_skipped_and_auto_approve_lists_are_kept(tmp_path):
    servers, notes = read(tmp_path, {"mcpServers": {
        "off": {"command": "/no/such/program", "disabled": True},
        "math": {**ADD, "disabled": False, "autoApprove": ["add"], "timeout": 60, "transportType": "stdio"},
        "roo": {**ADD, "alwaysAllow": ["add", "sub"]}}})
    assert [(s.name, s.auto_approve) for s in servers] == [("math", ("add",)), ("roo", ("add", "sub"))]
    assert any("skipped off (disabled in the file)" in n for n in notes)
    assert any("server 'math': ignored timeout (other clients' settings)" in n for n in notes)
    with pytest.raises(UsageError, match="server 'a': autoApprove must be a list of tool names"):
        read(tmp_path, {"mcpServers": {"a": {**ADD, "autoApprove": "add"}}})


def test_variables_with_defaults_and_vs_code_s_forms_are_read_everywhere(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_PYTHON", sys.executable)
    monkeypatch.setenv("MY_TOKEN", "t0k3n")
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    servers, _ = read(tmp_path, {"mcpServers": {
        "local": {"command": "${MY_PYTHON}", "args": ["${NOT_SET_HERE:-fallback}", "${workspaceFolder}"],
                  "env": {"T": "${env:MY_TOKEN}", "D": "${NOT_SET_HERE:-}"}},
        "remote": {"type": "sse", "url": "http://127.0.0.1:${NOT_SET_HERE:-9}/sse",
                   "headers": {"Authorization": "Bearer ${MY_TOKEN}"}}}})
    local, remote = servers
    assert local.command == sys.executable and local.args == ("fallback", str(Path.cwd()))
    assert local.env == {"T": "t0k3n", "D": ""}
    assert remote.legacy_sse and remote.url == "http://127.0.0.1:9/sse" and remote.headers["Authorization"] == \
        "Bearer t0k3n"


@pytest.mark.parametrize("data, needle", [
    ({"mcpServers": {"a": {**ADD}}, "servers": {}}, "both mcpServers and servers: keep one"),
    ({"globalShortcut": "x"}, "no mcpServers (or VS Code's servers) in the file; its keys: globalShortcut"),
    ([1, 2], "expected an object with mcpServers"),
    ({"mcpServers": {"a": {"command": "x", "colour": "red"}}}, "server 'a': colour is not a key of a stdio server"),
])
def test_what_no_client_writes_is_still_one_line(tmp_path, data, needle):
    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        read(tmp_path, data)


def test_a_tool_the_file_auto_approves_runs_without_a_terminal_and_says_so(home, tmp_path):
    path = written(tmp_path, {"globalShortcut": "", "mcpServers": {"math": {**ADD, "autoApprove": ["add"]}}})
    fake = FakeServer()
    call = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "x", "function": {
        "name": "math_add", "arguments": json.dumps({"a": 12, "b": 30})}}]}, "finish_reason": "tool_calls"}]}
    fake.chat([Reply(chunks=sse(call)), Reply(chunks=sse(delta("42.", "stop")))])
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", fake.base_url, "--mcp", str(path),
                                   "What is 12 plus 30?"])
    finally:
        fake.close()
    assert done.exit_code == 0 and done.stdout == "42.\n", done.stderr
    assert f"math_add runs without asking: autoApprove of server 'math' in {path}" in done.stderr
    assert "ignored globalShortcut" in done.stderr
    bodies = [json.loads(b) for p, _, b in fake.requests if p.endswith("completions")]
    assert [m["content"] for m in bodies[-1]["messages"] if m["role"] == "tool"] == ["42"]


def test_a_server_that_fails_to_start_shows_its_real_error_and_its_log(home, tmp_path):
    failing = {"command": sys.executable, "env": {owned.MARK: owned.RUN}, "args": ["-c", (
        "import sys; print('error: Request failed after 3 retries', file=sys.stderr); "
        "print('  Caused by: invalid peer certificate: UnknownIssuer', file=sys.stderr); "
        "print('hint: Consider enabling use of system TLS certificates with --native-tls', file=sys.stderr)")]}
    fake = FakeServer()
    fake.chat(Reply(chunks=sse(delta("Hi.", "stop"))))
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", fake.base_url, "--mcp",
                                   str(written(tmp_path, {"mcpServers": {"uvx": failing}})), "Hi"])
    finally:
        fake.close()
    line = next(line for line in done.stderr.splitlines() if "MCP server 'uvx' did not start" in line)
    assert "its stderr says: Caused by: invalid peer certificate: UnknownIssuer" in line and "hint" not in line
    assert f"its log: {home / 'logs'}" in line


def test_a_home_first_made_by_an_mcp_log_or_a_kv_cache_is_private_all_the_way(tmp_path, monkeypatch):
    import stat

    from localchat.store.kv_files import CacheFiles

    home = tmp_path / "fresh" / "home"
    monkeypatch.setenv("LOCALCHAT_HOME", str(home))
    fake = FakeServer()
    fake.chat(Reply(chunks=sse(delta("Hi.", "stop"))))
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", fake.base_url, "--no-log", "--mcp",
                                   str(written(tmp_path, {"mcpServers": {"math": ADD}})), "Hi"])
    finally:
        fake.close()
    assert done.exit_code == 0, done.stderr
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(home) == mode(home / "logs") == 0o700 and list((home / "logs").glob("mcp-*.pid")) == []
    assert all(mode(p) == 0o600 for p in (home / "logs").iterdir())
    CacheFiles(tmp_path / "other" / "kv-cache", 1 << 20).prepare()
    assert mode(tmp_path / "other") == mode(tmp_path / "other" / "kv-cache") == 0o700
    assert mode(tmp_path / "other" / "kv-cache" / "writing") == 0o700


def test_mcp_list_and_call_check_a_server_by_hand(home, tmp_path):
    path = written(tmp_path, {"mcpServers": {"math": ADD}})
    listed = runner.invoke(app, ["mcp", "list", "--mcp", str(path)])
    assert listed.exit_code == 0 and "math: ready" in listed.stdout and "math_add" in listed.stdout, listed.stderr
    called = runner.invoke(app, ["mcp", "call", "math", "add", '{"a": 12, "b": 30}', "--mcp", str(path)])
    assert called.exit_code == 0 and called.stdout == "42\n", called.stderr
    wrong = runner.invoke(app, ["mcp", "call", "math", "add", '{"a": "x", "b": 1}', "--mcp", str(path)])
    assert wrong.exit_code == 1 and "do not fit math_add's parameters" in wrong.stderr
    for arguments, needle in (("[1]", "must be a JSON object, not list"), ("{", "must be a JSON object")):
        bad = runner.invoke(app, ["mcp", "call", "math", "add", arguments, "--mcp", str(path)])
        assert bad.exit_code == 2 and needle in bad.stderr
    unknown = runner.invoke(app, ["mcp", "call", "math", "mul", "{}", "--mcp", str(path)])
    assert unknown.exit_code == 2 and "offers no tool 'mul' (offered as: math_add)" in unknown.stderr
    elsewhere = runner.invoke(app, ["mcp", "call", "maths", "add", "{}", "--mcp", str(path)])
    assert elsewhere.exit_code == 2 and "server 'maths' is not in the --mcp files (they configure: math)" in \
        elsewhere.stderr


def test_a_key_an_mcp_server_echoes_is_cut_before_it_is_shown_stored_or_sent(home, tmp_path, monkeypatch):
    key = "sk-canary-" + "7" * 24
    monkeypatch.setenv("LOCALCHAT_API_KEY", key)
    hostile = Path(__file__).resolve().parent / "hostile_mcp.py"
    entry = {"command": sys.executable, "args": [str(hostile), "env"],
             "env": {"TOKEN": "${LOCALCHAT_API_KEY}", owned.MARK: owned.RUN}}
    fake = FakeServer()
    call = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "x", "function": {
        "name": "h_add", "arguments": json.dumps({"a": 1, "b": 2})}}]}, "finish_reason": "tool_calls"}]}
    fake.chat([Reply(chunks=sse(call)), Reply(chunks=sse(delta("Done.", "stop")))])
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", fake.base_url, "--mcp",
                                   str(written(tmp_path, {"mcpServers": {"h": entry}})), "--approve-tools", "Go"])
    finally:
        fake.close()
    assert done.exit_code == 0, done.stderr
    sent = [json.loads(b) for p, _, b in fake.requests if p.endswith("completions")][-1]
    result = next(m["content"] for m in sent["messages"] if m["role"] == "tool")
    assert '"TOKEN": "[secret]"' in result and key not in result and key not in done.stderr + done.stdout
    stored = b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())
    assert key.encode() not in stored


@pytest.mark.parametrize("mode, said", [
    ("notify-flood", None), ("bad-progress", None),
    ("bad-list-changed", "said its tools changed, then sent a list that cannot be read"),
])
def test_a_server_s_noise_and_broken_notifications_are_one_line_at_most(home, tmp_path, mode, said):
    hostile = Path(__file__).resolve().parent / "hostile_mcp.py"
    entry = {"command": sys.executable, "args": [str(hostile), mode], "env": {owned.MARK: owned.RUN}}

    def call(a: int) -> Reply:
        return Reply(chunks=sse({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "x", "function": {
            "name": "h_add", "arguments": json.dumps({"a": a, "b": 2})}}]}, "finish_reason": "tool_calls"}]}))

    fake = FakeServer()
    fake.chat([call(1), call(5), Reply(chunks=sse(delta("Done.", "stop")))])
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", fake.base_url, "--mcp",
                                   str(written(tmp_path, {"mcpServers": {"h": entry}})), "--approve-tools", "Go"])
    finally:
        fake.close()
    assert done.exit_code == 0 and done.stdout == "Done.\n", done.stderr
    assert "Traceback" not in done.stderr and "validation error" not in done.stderr.split("(")[0]
    assert "← 3" in done.stderr and "← 7" in done.stderr
    assert (said is None) or done.stderr.count(said) == 1
