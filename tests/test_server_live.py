"""A real mlx_lm.server on a free loopback port, serving the demo model."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

import owned
from localchat.backends import GenerationParams
from localchat.backends.http import make_client
from localchat.backends.openai_http import ServerBackend
from localchat.cli.app import app
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.registry import resolve
from localchat.server import launch
from localchat.server.launch import QUIET_PORTS, free_port
from servers import serving

runner = CliRunner()
REMEMBER = "Remember the code harbor 17. Reply only OK."
RECALL = "What was the code? Reply with the code only."


SERVERS = ("mlx_lm server", "localchat.serve.engine.enforcing")  # serve --plain's, and serve's own


def mlx_servers() -> list[owned.Owned]:
    """This worker's mlx_lm servers (never a user's own)."""
    return owned.owned(*SERVERS)


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
    with serving("demo", tmp_path_factory.mktemp("log")) as server:
        yield server
    assert server.process.poll() is not None


@pytest.fixture(autouse=True, scope="module")
def no_orphans_afterwards():
    yield
    deadline = time.time() + 10
    while mlx_servers() and time.time() < deadline:
        time.sleep(0.2)
    assert mlx_servers() == []


def server_chat(live_server, use_history=True) -> ChatSession:
    backend = ServerBackend(make_client(live_server.base_url), live_server.model_location, model_id="demo")
    return ChatSession(backend, Conversation("You are a helpful assistant."),
                       GenerationParams(max_tokens=32), use_history=use_history)


def test_json_mode_through_the_server_sends_response_format(live_server, tmp_path):
    """mlx_lm.server accepts response_format (and ignores it); the instruction does the work and
    the reply is validated here all the same."""
    result = runner.invoke(app, ["chat", "--backend", "server", "--base-url", live_server.base_url, "-m", "demo",
                                 "--json", "--record", str(tmp_path), REMEMBER])
    assert result.exit_code == 0, result.stderr
    assert set(json.loads(result.stdout)) == {"answer"}
    request = json.loads(next(tmp_path.glob("*-request.json")).read_text())
    assert request["params"]["answer"]["schema"]["required"] == ["answer"]
    assert request["messages"][0]["content"].endswith('Answer in JSON: {"answer": "..."}')


def test_recall_with_history_through_the_server(live_server):
    chat = server_chat(live_server)
    assert chat.ask(REMEMBER).text == "OK"
    second = chat.ask(RECALL)
    assert second.text == "harbor 17"
    assert second.stats.cached_tokens > 0 and not second.stats.estimated
    assert second.stats.ttft_s is not None and second.stats.prompt_tokens > second.stats.cached_tokens


def test_samplers_draft_model_and_adapter_go_per_request_to_the_server(live_server, tmp_path):
    """mlx_lm.server reads top_k, min_p, repetition_penalty, draft_model and adapters per request:
    greedy answers stay the model's (speculation never changes them) and an adapter changes it as
    it does in-process."""
    from localchat.backends.inproc import load_inproc
    from localchat.backends.mlx_options import RuntimeOptions, server_fields
    from localchat.registry import local_dir
    from test_mlx_options import lora_adapter

    ref = resolve("demo")
    location = str(local_dir(ref))
    params = GenerationParams(max_tokens=32, top_k=5, min_p=0.05, repetition_penalty=1.05)
    fields = server_fields(RuntimeOptions(draft_model="demo-notes", num_draft_tokens=2), location, "default_model")
    drafted = ChatSession(ServerBackend(make_client(live_server.base_url), location, model_id="demo",
                                        extra_fields=fields), Conversation("You are a helpful assistant."), params)
    assert drafted.ask(REMEMBER).text == "OK" and drafted.ask(RECALL).text == "harbor 17"
    adapter = lora_adapter(ref.location, tmp_path / "adapter")
    adapted = ServerBackend(make_client(live_server.base_url), location, model_id="demo",
                            extra_fields=server_fields(RuntimeOptions(adapter_path=adapter), location, "default_model"))
    inproc = load_inproc(ref, local_dir(ref), options=RuntimeOptions(adapter_path=adapter))
    answers = [ChatSession(b, Conversation("You are a helpful assistant."), GenerationParams(max_tokens=32)).ask(
        REMEMBER).text for b in (adapted, inproc)]
    assert answers[0] == answers[1] != "OK"


def test_no_history_through_the_server(live_server):
    chat = server_chat(live_server, use_history=False)
    chat.ask(REMEMBER)
    assert chat.ask(RECALL).text == "I don't know."


def test_single_prompt_cli_through_the_server(live_server):
    result = runner.invoke(app, ["chat", "--backend", "server", "--base-url", live_server.base_url,
                                 "-m", "demo", "请记住代号「港口 17」，只回答「收到」。"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "收到\n" and "[TTFT" in result.stderr


def test_smoke_passes_and_prints_json(live_server):
    result = runner.invoke(app, ["smoke", "--base-url", live_server.base_url, "-m", "demo", "--json"])
    assert result.exit_code == 0, result.stdout
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert len(report["checks"]) == 7 and all(c["ok"] for c in report["checks"])
    assert report["checks"][-1]["detail"] == "valid JSON, enforced by the server"
    recall = next(c for c in report["checks"] if c["name"] == "two-turn recall")
    told, answered = recall["detail"].split(", answered ")
    assert told.removeprefix("told ") == answered  # the demo model is judged on the exact code


def test_smoke_passes_when_recall_is_not_judged(live_server):
    result = runner.invoke(app, ["smoke", "--base-url", live_server.base_url, "--json"])
    assert result.exit_code == 0, result.stdout
    report = json.loads(result.stdout)
    assert report["ok"] and len(report["checks"]) == 7 and all(c["ok"] for c in report["checks"])
    cache = next(c for c in report["checks"] if c["name"] == "prompt cache hit on turn 2")
    assert int(cache["detail"].split("= ")[1].split(" ")[0]) > 0


def test_smoke_fails_against_nothing():
    result = runner.invoke(app, ["smoke", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert not report["checks"][0]["ok"] and "cannot connect" in report["checks"][0]["detail"]


def test_a_free_port_is_one_no_outgoing_connection_can_take_and_never_a_bound_one(monkeypatch):
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1 and all(QUIET_PORTS[0] <= port < QUIET_PORTS[1] for port in ports), ports
    bound, other = sorted(ports)[:2]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", bound))
        tries = iter([bound, other])
        monkeypatch.setattr(launch.random, "randrange", lambda *_: next(tries))
        assert free_port() == other


def test_serve_refuses_a_busy_port(live_server):
    result = runner.invoke(app, ["serve", "--port", str(live_server.port)])
    assert result.exit_code == 1
    assert f"port {live_server.port}" in result.stderr and "busy" in result.stderr


def test_serve_reports_a_child_that_dies_at_start_up():
    result = runner.invoke(app, ["serve", "--port", str(free_port()), "--", "--no-such-flag"])
    assert result.exit_code == 1
    assert "exited with code 2 during start-up" in result.stderr
    assert "unrecognized arguments: --no-such-flag" in result.stderr  # the log's last lines


def test_parity_between_inproc_and_server():
    result = runner.invoke(app, ["parity", "--json"])
    assert result.exit_code == 0, result.stdout + result.stderr
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["ok"] and report["first_difference"] is None
    assert [t["inproc_prompt_tokens"] for t in report["turns"]] == [t["server_prompt_tokens"] for t in report["turns"]]


def mlx_children(pid: int) -> list[int]:
    return owned.children_of(pid, *SERVERS)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def serve_process():
    """`localchat serve` in a subprocess, up to "ready"; killed (with its child) whatever happens."""
    procs = []

    def start() -> tuple[subprocess.Popen, int]:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "localchat", "serve", "--port", str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=os.environ | {"COLUMNS": "80"})
        proc.port = port
        procs.append(proc)
        proc.seen = ""  # what it printed up to "Ctrl+C stops the server.": it is then serving, done talking
        for line in proc.stdout:
            proc.seen += line
            if "Ctrl+C stops the server" in line:
                break
        children = mlx_children(proc.pid)
        assert len(children) == 1
        return proc, children[0]

    yield start
    for proc in procs:
        for child in mlx_children(proc.pid):
            os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait()


def wait_gone(pid: int, seconds: float = 15) -> bool:
    deadline = time.time() + seconds
    while alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    return not alive(pid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_its_child_on_sigterm_and_ctrl_c(serve_process, sig):
    proc, child = serve_process()
    proc.send_signal(sig)
    assert proc.wait(30) == 0
    output = proc.seen + proc.stdout.read()
    assert "server stopped" in output
    assert wait_gone(child)
    # at 80 columns the command to copy is still one whole line
    hint = f"localchat chat --backend server --base-url http://127.0.0.1:{proc.port}/v1 -m demo"
    assert any(line.startswith("  ") and line.endswith(hint) for line in output.splitlines())


def test_the_child_dies_even_if_serve_is_killed(serve_process):
    proc, child = serve_process()
    proc.kill()  # SIGKILL: no handler runs; the kernel's parent-death signal stops the child
    proc.wait(10)
    assert wait_gone(child)
