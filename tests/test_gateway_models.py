"""The gateway with the models that call tools and think: demo-tools calls ``add`` through both
APIs and both SDKs (a whole round trip, streamed and not, stateful and not), demo-think's
reasoning comes back as thinking blocks and reasoning items; and from the command line,
``serve --api`` (ready, the done-when answers, SIGTERM stops both), ``smoke --api`` and
``load --api anthropic``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import anthropic
import httpx
import openai
import pytest

from gateways import gateway_for
from localchat.server.launch import free_port
from routed import wait_ended
from servers import serving

QUESTION = "What is 12 plus 30?"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
ADD = {"name": "add", "description": "Add two integers and return their sum.", "input_schema": SCHEMA}
ADD_FUNCTION = {"type": "function", "name": "add", "description": ADD["description"], "parameters": SCHEMA}


@pytest.fixture(scope="module")
def tools_gateway(tmp_path_factory):
    with serving("demo-tools", tmp_path_factory.mktemp("tools")) as server, \
            gateway_for(server.base_url, "demo-tools") as gateway:
        yield server, gateway


def test_demo_tools_calls_add_through_the_messages_api(tools_gateway):
    _, gateway = tools_gateway
    sdk = anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0)
    asked = [{"role": "user", "content": QUESTION}]
    first = sdk.messages.create(model="m", max_tokens=64, tools=[ADD], messages=asked)
    use = next(b for b in first.content if b.type == "tool_use")
    assert first.stop_reason == "tool_use" and use.name == "add" and use.input == {"a": 12, "b": 30}
    assert use.id.startswith("toolu_")
    deltas = []
    with sdk.messages.stream(model="m", max_tokens=64, tools=[ADD], messages=asked) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                deltas.append(event.delta.partial_json)
        streamed = stream.get_final_message()
    assert json.loads("".join(deltas)) == {"a": 12, "b": 30} and streamed.stop_reason == "tool_use"
    asked += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]}]
    answer = sdk.messages.create(model="m", max_tokens=64, tools=[ADD], messages=asked)
    assert answer.stop_reason == "end_turn" and "42" in answer.content[0].text
    none = sdk.messages.create(model="m", max_tokens=64, tools=[ADD], tool_choice={"type": "none"},
                               messages=[{"role": "user", "content": QUESTION}])
    assert all(b.type != "tool_use" for b in none.content)  # no tools offered: none can be called


def test_the_gateways_replies_say_where_an_agents_prompt_broke_from_the_cache(tools_gateway):
    """A clock in Anthropic's ``system``: the stream's header says message 0 (system). Tools
    reordered through Responses, or an earlier turn's reasoning dropped: the gateway keeps one prompt."""
    _, gateway = tools_gateway
    claude = anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0)
    codex = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)

    def claude_step(clock: str) -> str:
        raw = claude.messages.with_raw_response.create(
            model="m", max_tokens=4, stream=True, tools=[ADD], messages=[{"role": "user", "content": QUESTION}],
            system=f"You add numbers for the gateway's clock test. The time is {clock}.")
        list(raw.parse())
        return raw.headers["x-localchat-prefix-cache"]

    claude_step("10:41")
    assert "broke-at=" not in claude_step("10:41")
    assert "message=0; role=system" in claude_step("10:42")

    other = {**ADD_FUNCTION, "name": "multiply", "description": "Multiply two integers."}

    def codex_step(tools: list, reasoning: list) -> str:
        items = [{"type": "message", "role": "user", "content": "Add 2 and 5 for the reorder test."},
                 *reasoning, {"type": "message", "role": "assistant", "content": "7"},
                 {"type": "message", "role": "user", "content": QUESTION}]
        raw = codex.responses.with_raw_response.create(model="m", input=items, tools=tools, max_output_tokens=4,
                                                      store=False)
        raw.parse()
        return raw.headers["x-localchat-prefix-cache"]

    thought = [{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "2 + 5 = 7."}]}]
    codex_step([ADD_FUNCTION, other], thought)
    kept = codex_step([other, ADD_FUNCTION], [])  # reordered, and the earlier turn's reasoning dropped
    assert kept.startswith("cached=") and "broke-at=" not in kept, kept


def test_demo_tools_calls_add_through_the_responses_api(tools_gateway):
    _, gateway = tools_gateway
    sdk = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    first = sdk.responses.create(model="m", input=QUESTION, tools=[ADD_FUNCTION])
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "add" and json.loads(call.arguments) == {"a": 12, "b": 30}
    stateful = sdk.responses.create(model="m", previous_response_id=first.id, tools=[ADD_FUNCTION],
                                    input=[{"type": "function_call_output", "call_id": call.call_id, "output": "42"}])
    assert "42" in stateful.output_text
    events = list(sdk.responses.create(model="m", store=False, stream=True, tools=[ADD_FUNCTION], input=[
        {"role": "user", "content": QUESTION},
        {"type": "function_call", "call_id": call.call_id, "name": "add", "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "42"}]))
    assert events[-1].type == "response.completed" and events[-1].response.output_text == stateful.output_text
    streamed_call = list(
        sdk.responses.create(model="m", stream=True, store=False, tools=[ADD_FUNCTION], input=QUESTION)
    )
    done = [e for e in streamed_call if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == {"a": 12, "b": 30}


def test_smoke_api_passes_every_check_for_demo_tools(tools_gateway):
    from typer.testing import CliRunner

    from localchat.cli.app import app

    _, gateway = tools_gateway
    done = CliRunner().invoke(app, ["smoke", "--base-url", gateway.url + "/v1", "-m", "demo-tools", "--api",
                                    "anthropic,responses", "--json"])  # the list serve --api takes
    reports = json.loads(done.stdout)
    assert done.exit_code == 0 and len(reports) == 2 and all(r["ok"] for r in reports), done.stdout
    for report in reports:
        rows = {row["name"]: row for row in report["checks"]}
        call = rows["tool call round trip"]
        assert call["ok"] and "called add({'a': 12, 'b': 30})" in call["detail"]
        assert rows["prompt cache hit on turn 2"]["ok"]
        recall = rows["two-turn recall (not required)"]  # judged on the answer all the same
        assert recall["ok"] == ("harbor 17" in recall["detail"].split("answered")[1]) and not recall["required"]


def test_demo_think_reasons_in_thinking_blocks_and_reasoning_items(tmp_path):
    with serving("demo-think", tmp_path) as server, gateway_for(server.base_url, "demo-think") as gateway:
        question = [{"role": "user", "content": "Remember the code harbor 17. Reply only OK."}]
        reference = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
            "model": server.model_location, "messages": question, "max_tokens": 64, "temperature": 0.0}).json()
        message = reference["choices"][0]["message"]
        sdk = anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0)
        with sdk.messages.stream(model="m", max_tokens=64, messages=question) as stream:
            reply = stream.get_final_message()
        assert [b.type for b in reply.content] == ["thinking", "text"]
        assert reply.content[0].thinking == message["reasoning"] and reply.content[1].text == message["content"]
        replayed = sdk.messages.create(model="m", max_tokens=64, messages=[
            *question, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
            {"role": "user", "content": "What was the code? Reply with the code only."}])
        assert replayed.content[-1].text == "harbor 17"  # the thinking block went back as the template takes it
        oai = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
        response = oai.responses.create(model="m", input=question, reasoning={"effort": "low"})
        assert [i.type for i in response.output] == ["reasoning", "message"]
        assert response.output[0].content[0].text == message["reasoning"]
        assert response.output_text == message["content"] and response.usage.output_tokens_details.reasoning_tokens > 0


# --- the command line ---------------------------------------------------------------------------------------

def localchat(*args: str, home) -> subprocess.Popen:
    env = {**os.environ, "LOCALCHAT_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "localchat", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_line(process: subprocess.Popen, pattern: str, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if re.search(pattern, line):
            return line
        if not line and process.poll() is not None:
            raise AssertionError(f"ended ({process.returncode}): {process.stderr.read()}")
    raise AssertionError(f"no line matching {pattern!r}")


def test_serve_api_answers_as_chat_completions_through_both_sdks_and_sigterm_stops_both(tmp_path):
    port = free_port()
    served = localchat("serve", "--api", "anthropic,responses", "--port", str(port), home=tmp_path)
    try:
        wait_for_line(served, r"^ready ")
        engine = httpx.get(f"http://127.0.0.1:{port}/localchat/ps", timeout=10).json()["models"][0]["pid"]
        conversation = [{"role": "user", "content": "Remember the code harbor 17. Reply only OK."},
                        {"role": "assistant", "content": "OK"},
                        {"role": "user", "content": "What was the code? Reply with the code only."}]
        chat = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
            "model": "default_model", "messages": conversation, "max_tokens": 32}).json()
        expected = chat["choices"][0]["message"]["content"]
        with anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="x").messages.stream(
                model="claude-sonnet-4-5", max_tokens=32, messages=conversation) as stream:
            assert stream.get_final_message().content[0].text == expected == "harbor 17"
        responses = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x").responses.create(
            model="gpt-5", input=conversation)
        assert responses.output_text == expected
        served.send_signal(signal.SIGTERM)
        assert served.wait(30) == 0  # SIGTERM stops a server cleanly, as plain serve
        assert "server stopped" in served.stdout.read() and "Traceback" not in served.stderr.read()
        assert wait_ended(engine)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        if served.poll() is None:
            served.kill()


def test_gateway_and_serve_refuse_bad_flags_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from localchat.cli.app import app

    runner = CliRunner(env={"LOCALCHAT_HOME": str(tmp_path)})
    bogus = runner.invoke(app, ["serve", "--api", "anthropic,grpc"])
    assert bogus.exit_code == 2 and "--api takes anthropic or responses" in bogus.stderr
    nobody = runner.invoke(
        app, ["gateway", "--upstream", f"http://127.0.0.1:{free_port()}/v1", "--port", str(free_port())]
    )
    assert nobody.exit_code == 1 and "cannot reach the server" in nobody.stderr and "Traceback" not in nobody.stderr
    with __import__("socket").socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = runner.invoke(app, ["gateway", "--upstream", "http://127.0.0.1:9/v1", "--port",
                                   str(taken.getsockname()[1])])
    assert busy.exit_code == 2 and "already in use" in busy.stderr


def test_load_drives_the_messages_api_through_a_launched_gateway(tmp_path):
    from typer.testing import CliRunner

    from localchat.cli.app import app

    done = CliRunner(env={"LOCALCHAT_HOME": str(tmp_path)}).invoke(app, [
        "load", "--launch", "--api", "anthropic", "-m", "demo", "--users", "2", "--conversations", "1", "--warmup", "0",
        "--history", "on", "--out", str(tmp_path / "out")])
    assert done.exit_code == 0, done.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    run = results["runs"][0]
    assert results["settings"]["api"] == "anthropic" and run["errors"] == {} and run["ok"] == run["requests"] == 4
    assert run["accuracy"]["rate"] == 1.0 and run["ttft_s"]["p50"] > 0
