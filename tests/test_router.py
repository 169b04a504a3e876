"""Several models on one port (``serve -m A -m B``): real engine children of demo, demo-tools,
SmolLM2 and a model that never stops, routed by name, loaded lazily and once, unloaded when idle
or to make room within the memory budget, refused when they cannot fit, reloaded after a crash,
and never left behind by a front that is killed. Tests touch only the processes they started
(``owned``: the mark each one inherits)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

import owned
from localchat.server.launch import free_port
from routed import HELLO, Serve, ended, wait_ended


@pytest.fixture
def serves(tmp_path):
    started: list[Serve] = []

    def start(*args: str) -> Serve:
        started.append(Serve(tmp_path / f"home{len(started)}", *args))
        return started[-1]

    yield start
    for serve in started:
        serve.stop()


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """demo (loaded at start) and demo-tools (on demand), both APIs of the gateway, kept 5 minutes."""
    serve = Serve(tmp_path_factory.mktemp("home"), "-m", "demo", "-m", "demo-tools", "--api", "anthropic,responses")
    yield serve
    serve.stop()


def test_one_port_routes_by_id_alias_and_path_and_loads_on_first_use(two_models):
    serve = two_models
    listed = openai.OpenAI(base_url=serve.url + "/v1", api_key="x", max_retries=0).models.list()
    assert [m.id for m in listed.data] == ["demo", "demo-tools"]  # ids, never a path
    assert "demo-tools" not in serve.held_names()  # not loaded before it is asked for
    sdk = openai.OpenAI(base_url=serve.url + "/v1", api_key="x", max_retries=0)
    for name in ("demo", "tiny", str(Path(__file__).parents[1] / "localchat" / "demo_model")):
        reply = sdk.chat.completions.create(model=name, messages=HELLO, max_tokens=8, temperature=0)
        assert reply.choices[0].message.content == "OK"
    tools = sdk.chat.completions.create(model="tools", max_tokens=64, temperature=0,
                                        messages=[{"role": "user", "content": "What is 12 plus 30?"}],
                                        tools=[{"type": "function", "function": {
                                            "name": "add", "description": "Add two integers.",
                                            "parameters": {"type": "object", "properties": {
                                                "a": {"type": "integer"}, "b": {"type": "integer"}}}}}])
    call = tools.choices[0].message.tool_calls[0]
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 12, "b": 30}
    assert "demo-tools" in serve.held_names()
    assert "the model loaded first" in serve.wait_log("demo-tools · ")  # its TTFT included the load, said so
    stream = sdk.chat.completions.create(model="demo", messages=HELLO, max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "OK"


def test_both_gateway_apis_route_by_model_name(two_models):
    serve = two_models
    claude = anthropic.Anthropic(base_url=serve.url, api_key="x", max_retries=0)
    said = claude.messages.create(model="demo", max_tokens=8, messages=HELLO, extra_body={"temperature": 0})
    assert said.content[0].text == "OK"
    responses = openai.OpenAI(base_url=serve.url + "/v1", api_key="x", max_retries=0).responses
    answered = responses.create(model="demo-tools", input="What is 12 plus 30?", max_output_tokens=64,
                                tools=[{"type": "function", "name": "add", "description": "Add two integers.",
                                        "parameters": {"type": "object", "properties": {
                                            "a": {"type": "integer"}, "b": {"type": "integer"}}}}])
    assert any(item.type == "function_call" and item.name == "add" for item in answered.output)


def test_an_unknown_name_is_a_404_naming_what_is_served(two_models):
    sdk = openai.OpenAI(base_url=two_models.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(model="llama-70b", messages=HELLO)
    assert "no model 'llama-70b'" in str(caught.value) and "demo, demo-tools" in str(caught.value)
    claude = anthropic.Anthropic(base_url=two_models.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=HELLO)


def test_ps_lists_what_is_held_with_its_memory(two_models):
    two_models.ask("demo")
    done = subprocess.run([sys.executable, "-m", "localchat", "ps", "--base-url", two_models.url + "/v1", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {row["model"]: row for row in json.loads(done.stdout)}
    demo = rows["demo"]
    assert demo["memory_bytes"] > 0 and demo["in_flight"] == 0 and demo["pid"] > 0
    assert 0 < demo["expires_in_s"] <= 300 and demo["resident_bytes"] > 0
    assert not ended(demo["pid"])
    table = subprocess.run([sys.executable, "-m", "localchat", "ps", "--base-url", two_models.url + "/v1"],
                           capture_output=True, text=True, timeout=60, env=os.environ | {"COLUMNS": "200"})
    assert "demo" in table.stdout and "loaded" in table.stdout and "MB" in table.stdout
    by_port = subprocess.run([sys.executable, "-m", "localchat", "ps", "--port", str(two_models.port), "--json"],
                             capture_output=True, text=True, timeout=60)
    assert by_port.returncode == 0 and "demo" in {row["model"] for row in json.loads(by_port.stdout)}
    nothing = subprocess.run([sys.executable, "-m", "localchat", "ps", "--base-url", f"http://127.0.0.1:{free_port()}"],
                             capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 1 and "nothing answers" in nothing.stderr and "Traceback" not in nothing.stderr


def test_a_race_for_an_unloaded_model_loads_it_once_and_idle_models_go(serves):
    serve = serves("-m", "demo", "-m", "demo-tools", "--keep-alive", "2s")
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: serve.ask("demo-tools"), range(4)))
    assert [r.status_code for r in replies] == [200] * 4
    assert sum("loaded demo-tools" in line for line in serve.log) == 1
    pid = next(row["pid"] for row in serve.held() if row["model"] == "demo-tools")
    serve.wait_log("unloaded demo-tools after")
    assert wait_ended(pid) and "demo-tools" not in serve.held_names()
    assert serve.ask("demo-tools").status_code == 200  # loaded again
    assert "demo-tools" in serve.held_names()


def test_keep_alive_in_a_request_and_a_pin(serves):
    serve = serves("-m", "demo", "-m", "demo-tools", "--keep-alive", "never", "--pin", "demo")
    assert serve.ask("demo-tools", keep_alive=0).status_code == 200
    assert serve.wait_log("unloaded demo-tools after ").endswith("idle (keep-alive 0s)")  # (0s, or 1s: a late reaper)
    assert serve.ask("demo", keep_alive=0).status_code == 200
    time.sleep(1.0)
    assert serve.held_names() == {"demo"}  # pinned: kept whatever the request said
    bad = serve.ask("demo", keep_alive="soon")
    assert bad.status_code == 400 and "keep-alive" in bad.json()["error"]["message"]


def test_a_budget_for_one_model_swaps_them_and_one_too_big_alone_is_a_503(serves, smollm2):
    serve = serves("-m", "demo", "-m", "demo-tools", "-m", str(smollm2), "--memory-limit", "50MB")
    assert serve.ask("demo").status_code == 200
    assert serve.ask("demo-tools").status_code == 200  # demo (idle, least recently used) made room
    assert serve.held_names() == {"demo-tools"}
    serve.wait_log("unloaded demo to make room")
    assert serve.ask("demo").status_code == 200 and serve.held_names() == {"demo"}
    too_big = serve.ask(str(smollm2))
    message = too_big.json()["error"]["message"]
    assert too_big.status_code == 503 and "needs ~" in message and "your memory limit is" in message
    assert serve.ask("demo").status_code == 200  # the others keep serving
    assert serve.held_names() == {"demo"}


def test_a_child_killed_mid_stream_fails_that_request_and_the_next_reloads_it(serves, rambling_model):
    serve = serves("-m", str(rambling_model))
    pid = serve.held()[0]["pid"]
    with httpx.stream("POST", serve.url + "/v1/chat/completions", timeout=60,
                      json={"model": str(rambling_model), "messages": HELLO, "max_tokens": 100000,
                            "stream": True}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # (after the prefill's keep-alives)
        os.kill(pid, signal.SIGKILL)
        rest = list(lines)  # the stream ends; it never hangs
    assert "[DONE]" not in "".join(rest)
    serve.wait_log("engine ended by itself")
    again = serve.ask(str(rambling_model), max_tokens=4)
    assert again.status_code == 200 and serve.held()[0]["pid"] != pid


def test_a_client_that_hangs_up_mid_stream_leaves_its_model_reloadable_twice(serves, rambling_model):
    """A closed browser tab: the engine says so in one line (no traceback), the model idles out, and
    the next request loads it again; a reload is judged by its own start, not by what an earlier
    child left in the log they share."""
    name = str(rambling_model)
    serve = serves("-m", name, "--keep-alive", "1s")
    assert f"the chat page: {serve.url}/" in serve.out and "unloads after 1s idle" in serve.out  # said as it starts
    root = httpx.get(serve.url + "/", timeout=10).json()
    assert root["page"].startswith(serve.url + "/") and "browser" in root["page"]  # curl / says where the page is
    for round_ in (1, 2):
        row = serve.held()[0]
        with httpx.stream("POST", serve.url + "/v1/chat/completions", timeout=60,
                          json={"model": name, "messages": HELLO, "max_tokens": 100000, "stream": True}) as response:
            assert response.status_code == 200
            assert next(line for line in response.iter_lines() if line.startswith("data:"))
        deadline = time.monotonic() + 60
        while sum("unloaded" in line and "idle" in line for line in serve.log) < round_ and time.monotonic() < deadline:
            time.sleep(0.1)
        assert wait_ended(row["pid"])
        again = serve.ask(name, max_tokens=4)
        assert again.status_code == 200, again.text
    engine_log = Path(serve.held()[0]["log"]).read_text()
    assert "client hung up" in engine_log and "Traceback" not in engine_log


def test_a_model_that_cannot_load_is_a_503_that_names_no_local_path(serves, broken_model):
    """The reply says why (the engine's own line); the engine's log path is in serve's output only."""
    broken = broken_model
    serve = serves("-m", "demo", "-m", str(broken))
    for _ in range(2):  # each failed load says why, once, by its own start
        reply = serve.ask(str(broken))
        message = reply.json()["error"]["message"]
        assert reply.status_code == 503 and "nosucharch" in message and "log:" not in message
        assert str(serve.url) not in message and "/logs/" not in message and "server-" not in message
    serve.ask("demo")  # (serve's own lines of the failures are written by then, read by another thread)
    def said() -> int:
        return sum("failed to load" in line and "(log: " in line for line in serve.log)

    deadline = time.monotonic() + 10
    while said() < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert said() == 2
    assert serve.ask("demo").status_code == 200


def test_rm_refuses_a_model_a_serve_is_serving_and_says_where(serves, rambling_model):
    serve = serves("-m", str(rambling_model))
    env = os.environ | {"LOCALCHAT_HOME": str(serve.home)}
    refused = subprocess.run([sys.executable, "-m", "localchat", "rm", str(rambling_model), "--yes"],
                             capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 1 and f"port {serve.port}" in refused.stderr and "stop it first" in refused.stderr
    assert Path(rambling_model).is_dir()
    serve.stop()
    after = subprocess.run([sys.executable, "-m", "localchat", "rm", str(rambling_model), "--yes"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert "being served" not in after.stderr and not list((serve.home / "serving").glob("*.json"))


def test_no_child_outlives_a_front_killed_with_sigkill(serves):
    serve = serves("-m", "demo", "-m", "demo-tools")
    serve.ask("demo-tools")
    pids = [row["pid"] for row in serve.held()]
    assert len(pids) == 2 and all(p in {o.pid for o in owned.owned("localchat.serve.engine.enforcing")} for p in pids)
    os.kill(pids[1], signal.SIGSTOP)  # a stopped child takes no signal but SIGKILL until it is continued
    serve.proc.kill()
    serve.proc.wait(10)
    assert all(wait_ended(pid) for pid in pids)


def test_a_model_served_elsewhere_is_routed_never_loaded(serves):
    behind = serves("-m", "demo-tools")
    front = serves("-m", "demo", "--upstream", f"far={behind.url}/v1")
    sdk = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0)
    assert [m.id for m in sdk.models.list().data] == ["demo", "far"]
    reply = sdk.chat.completions.create(model="far", messages=[{"role": "user", "content": "What is 2 plus 3?"}],
                                        max_tokens=64, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "tool_calls")
    streamed = list(sdk.chat.completions.create(model="far", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=8, temperature=0, stream=True))  # (chunks of chunks)
    assert streamed[-1].choices[0].finish_reason in ("stop", "length") and {c.model for c in streamed} == {reply.model}
    assert front.held_names() == {"demo"}  # nothing of far's is held here
    assert "(relayed) · far · " in front.wait_log("far · ")  # byte for byte: nothing in it is rewritten


@pytest.mark.parametrize("keep_alive, status", [(True, 400), ([1], 400), ("soon", 400), ("nan", 400), ({"a": 1}, 400),
                                                ("1e400", 200), (-1, 200), ("1h30m", 200)])
def test_a_requests_keep_alive_is_read_as_ollama_reads_it_or_refused(two_models, keep_alive, status):
    reply = two_models.ask("demo", keep_alive=keep_alive)
    assert reply.status_code == status, reply.text
    if status == 400:
        assert "keep-alive" in reply.json()["error"]["message"]


def test_hostile_names_and_bodies_are_one_answer_each(two_models):
    long_name = "x" * 20_000
    missing = two_models.ask(long_name)
    assert missing.status_code == 404 and len(missing.json()["error"]["message"]) < 400
    for body in (b"not json", b"[]", b'{"model": 12, "messages": []}', b'{"model": "demo", "messages": "x"}'):
        answer = httpx.post(two_models.url + "/v1/chat/completions", content=body, timeout=30,
                            headers={"content-type": "application/json"})
        assert 400 <= answer.status_code < 500, (body, answer.status_code, answer.text)
    assert two_models.ask("demo").status_code == 200  # still serving
