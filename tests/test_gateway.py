"""The gateway with the official clients: the ``anthropic`` SDK (create, stream, count_tokens) and
the ``openai`` SDK's Responses against a real mlx_lm.server serving the demo; greedy answers equal
chat completions'; every bad input an error in the API's own shape; a client that goes away
cancels the request upstream; an upstream that dies or is down is an error, never a hang."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import anthropic
import httpx
import openai
import pytest

from fakeserver import FakeServer, Reply, delta, sse
from gateways import gateway_for
from servers import serving

REMEMBER = "Remember the code harbor 17. Reply only OK."
RECALL = "What was the code? Reply with the code only."
CONVERSATION = [{"role": "user", "content": REMEMBER}, {"role": "assistant", "content": "OK"},
                {"role": "user", "content": RECALL}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving("demo", tmp_path_factory.mktemp("demo")) as running:
        yield running


@pytest.fixture(scope="module")
def gateway(server):
    with gateway_for(server.base_url, "demo") as running:
        yield running


@pytest.fixture(scope="module")
def claude(gateway):
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def oai(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def chat_completion(server, messages: list[dict], **fields) -> dict:
    """What chat completions answers the same conversation, greedy (the reference)."""
    reply = httpx.post(server.base_url + "/chat/completions", timeout=60.0, json={
        "model": server.model_location, "messages": messages, "max_tokens": 32, "temperature": 0.0, **fields})
    assert reply.status_code == 200, reply.text
    return reply.json()


# --- the same answers --------------------------------------------------------------------------------

def test_anthropic_create_and_stream_equal_chat_completions_with_usage_and_cache(server, claude):
    reference = chat_completion(server, CONVERSATION)
    expected = reference["choices"][0]["message"]["content"]
    assert expected == "harbor 17"
    whole = claude.messages.create(model="claude-sonnet-4-5", max_tokens=32, messages=CONVERSATION,
                                   extra_body={"temperature": 0.0})
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text == expected
    assert whole.stop_reason == "end_turn" and whole.model == "claude-sonnet-4-5"
    kinds = []
    with claude.messages.stream(model="claude-sonnet-4-5", max_tokens=32, messages=CONVERSATION) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert final.content[0].text == expected  # no temperature sent: the server's own default (greedy)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert kinds.index("content_block_start") < kinds.index("content_block_stop") < kinds.index("message_delta")
    usage = final.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == reference["usage"]["prompt_tokens"]
    assert usage.cache_read_input_tokens > 0 and usage.output_tokens == reference["usage"]["completion_tokens"]


def test_count_tokens_is_the_prompt_the_server_renders(server, claude):
    counted = claude.messages.count_tokens(model="any", messages=CONVERSATION, system="Be brief.")
    reference = chat_completion(server, [{"role": "system", "content": "Be brief."}, *CONVERSATION], max_tokens=1)
    assert counted.input_tokens == reference["usage"]["prompt_tokens"]


def test_responses_create_stream_and_previous_response_id(server, oai):
    expected = chat_completion(server, CONVERSATION)["choices"][0]["message"]["content"]
    first = oai.responses.create(model="gpt-5", input=REMEMBER, temperature=0.0)
    assert first.output_text == "OK" and first.status == "completed" and first.usage.input_tokens > 0
    second = oai.responses.create(model="gpt-5", input=RECALL, previous_response_id=first.id)
    assert second.output_text == expected
    assert second.usage.input_tokens_details.cached_tokens > 0
    kinds, text, numbers = [], "", []
    for event in oai.responses.create(model="gpt-5", input=CONVERSATION, stream=True, store=False):
        kinds.append(event.type)
        numbers.append(event.sequence_number)
        text += event.delta if event.type == "response.output_text.delta" else ""
    assert text == expected and kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert {"response.output_item.added", "response.content_part.added", "response.output_text.done",
            "response.output_item.done"} <= set(kinds)
    assert numbers == list(range(len(numbers)))


def test_store_false_keeps_nothing_and_an_unknown_previous_response_is_a_clear_400(oai):
    unstored = oai.responses.create(model="m", input=REMEMBER, store=False)
    for missing in (unstored.id, "resp_never"):
        with pytest.raises(openai.BadRequestError) as refused:
            oai.responses.create(model="m", input=RECALL, previous_response_id=missing)
        assert refused.value.body["param"] == "previous_response_id" and missing in refused.value.body["message"]


def test_stop_sequences_and_max_tokens_say_why_the_reply_ended(claude, oai):
    stopped = claude.messages.create(model="m", max_tokens=32, messages=CONVERSATION, stop_sequences=[" 17", "zz"])
    assert stopped.content[0].text == "harbor" and stopped.stop_reason == "stop_sequence"
    assert stopped.stop_sequence == " 17"
    cut = claude.messages.create(model="m", max_tokens=2, messages=CONVERSATION)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
    short = oai.responses.create(model="m", input=CONVERSATION, max_output_tokens=2, store=False)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"


def test_chat_completions_models_and_health_pass_through(server, gateway):
    direct = chat_completion(server, CONVERSATION)["choices"][0]["message"]["content"]
    through = gateway.post("/v1/chat/completions", json={"model": server.model_location, "messages": CONVERSATION,
                                                         "max_tokens": 32, "temperature": 0.0, "stream": True})
    streamed = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                       for line in through.text.splitlines()
                       if line.startswith("data: {") and json.loads(line[6:])["choices"])
    assert through.status_code == 200 and streamed == direct
    assert httpx.get(gateway.url + "/health").json() == {"status": "ok"}
    assert httpx.get(gateway.url + "/v1/models").json()["object"] == "list"


def test_a_machine_without_a_hugging_face_cache_still_lists_models(tmp_path):
    """mlx_lm.server answers /v1/models by scanning Hugging Face's cache, and drops the connection
    when that directory is missing (a machine whose models came from a GGUF or the demo): the
    launch creates it, where the child will look."""
    hub = tmp_path / "hf" / "hub"
    subprocess.run([sys.executable, "-c", "from localchat.server.launch import ensure_hub_cache; ensure_hub_cache()"],
                   env=os.environ | {"HF_HUB_CACHE": str(hub)}, check=True, timeout=60)
    assert hub.is_dir()


def test_each_request_is_logged_with_its_figures(gateway, claude):
    claude.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
    line = gateway.logs[-1]
    assert line.startswith("POST /v1/messages 200 · demo · [TTFT ") and " in " in line and " out " in line
    rate = re.search(r"([\d.]+) tok/s", line)  # none when the server sent the tokens in bursts (a loaded machine)
    assert rate is None or float(rate[1]) < 20_000, line  # never a figure the clock could not see


# --- bad input, in each API's own shape --------------------------------------------------------------------

GOOD = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
ANTHROPIC_BAD = {
    "not JSON": (b"{not json", "not valid JSON"),
    "a list": (json.dumps([GOOD]), "must be a JSON object"),
    "max_tokens a string": ({**GOOD, "max_tokens": "ten"}, "max_tokens: must be an integer"),
    "max_tokens missing": ({k: v for k, v in GOOD.items() if k != "max_tokens"}, "max_tokens: Field required"),
    "max_tokens true": ({**GOOD, "max_tokens": True}, "max_tokens: must be an integer"),
    "temperature too high": ({**GOOD, "temperature": 7}, "temperature: must be between 0 and 1"),
    "messages an object": ({**GOOD, "messages": {"role": "user"}}, "messages: must be a list"),
    "no messages": ({**GOOD, "messages": []}, "at least one message"),
    "content a number": ({**GOOD, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    "unknown role": ({**GOOD, "messages": [{"role": "tool", "content": "Hi"}]}, "messages.0.role"),
    "an image": ({**GOOD, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]},
        "is not a picture localchat can read"),
    "a result with no call": ({**GOOD, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": "42"}]}]}, "no tool_use before it"),
    "an assistant last": ({**GOOD, "messages": [{"role": "user", "content": "Hi"},
                                                {"role": "assistant", "content": "Hel"}]}, "the last message"),
    "a lone surrogate": ('{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "\\ud800"}]}',
                         "not valid Unicode"),
    "nested too deep": ('{"model": "m", "max_tokens": 8, "metadata": ' + "[" * 500 + "]" * 500 + ', "messages": []}',
                        "nested more than"),
    "stop_sequences of numbers": ({**GOOD, "stop_sequences": [1]}, "stop_sequences"),
    "tool without schema": ({**GOOD, "tools": [{"name": "add"}]}, "tools.0.input_schema: Field required"),
    "tool_choice unknown tool": ({**GOOD, "tools": [{"name": "add", "input_schema": {"type": "object"}}],
                                  "tool_choice": {"type": "tool", "name": "sub"}}, "tool_choice.name"),
}


@pytest.mark.parametrize("body, words", ANTHROPIC_BAD.values(), ids=ANTHROPIC_BAD.keys())
def test_bad_messages_requests_are_anthropic_errors(gateway, body, words):
    raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
    reply = gateway.post("/v1/messages", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert words in error["error"]["message"], error


RESPONSES_BAD = {
    "input a number": ({"model": "m", "input": 3}, "input: must be a list"),
    "an image part": ({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}, "only an image_url holding a data: URL"),
    "an output with no call": ({"model": "m", "input": [{"type": "function_call_output", "call_id": "call_1",
                                                          "output": "42"}]}, "no function_call before it"),
    "an unknown item": ({"model": "m", "input": [{"type": "computer_call", "call_id": "c"}]}, "not supported"),
    "unknown role": ({"model": "m", "input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
    "arguments not JSON": ({"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "add",
                                                      "arguments": "{a"}]}, "input.0.arguments"),
    "temperature a string": ({"model": "m", "input": "Hi", "temperature": "hot"}, "temperature: must be a number"),
    "no model": ({"input": "Hi"}, "model: Field required"),
}


@pytest.mark.parametrize("body, words", RESPONSES_BAD.values(), ids=RESPONSES_BAD.keys())
def test_bad_responses_requests_are_openai_errors(gateway, body, words):
    reply = gateway.post("/v1/responses", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "invalid_request_error" and words in reply.json()["error"]["message"]


def test_bodies_over_10_mb_are_refused_as_they_arrive(gateway):
    big = b'{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "' + b"x" * (11 * 2**20) + b'"}]}'
    declared = gateway.post("/v1/messages", content=big, headers={"content-type": "application/json"})
    assert declared.status_code == 413 and declared.json()["error"]["type"] == "request_too_large"

    def chunks():  # no Content-Length: counted as it comes
        for _ in range(12):
            yield b"x" * 2**20

    streamed = gateway.post("/v1/responses", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413 and "limit" in streamed.json()["error"]["message"]


def test_wrong_method_and_unknown_path_are_shaped_errors(gateway):
    wrong = httpx.get(gateway.url + "/v1/messages")
    assert wrong.status_code == 405 and wrong.json()["type"] == "error"
    unknown = httpx.post(gateway.url + "/v1/embeddings", json={})
    assert unknown.status_code == 404 and "no such endpoint" in unknown.json()["error"]["message"]


def test_the_key_is_checked_on_x_api_key_and_bearer(server):
    with gateway_for(server.base_url, "demo", api_key="s3cret-key") as guarded:
        refused = guarded.post("/v1/messages", json=GOOD)
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert guarded.post("/v1/messages", json=GOOD, headers={"x-api-key": "wrong"}).status_code == 401
        assert guarded.post("/v1/messages", json=GOOD, headers={"x-api-key": "s3cret-key"}).status_code == 200
        bearer = {"authorization": "Bearer s3cret-key"}
        assert guarded.post("/v1/responses", json={"model": "m", "input": "Hi", "max_output_tokens": 4},
                            headers=bearer).status_code == 200
        assert httpx.get(guarded.url + "/v1/models").status_code == 401
        assert httpx.get(guarded.url + "/health").status_code == 200
        sdk = anthropic.Anthropic(base_url=guarded.url, api_key="s3cret-key", max_retries=0)
        assert sdk.messages.create(model="m", max_tokens=4, messages=GOOD["messages"]).content


# --- faults: a client that goes away, an upstream that dies or is not there ----------------------------------

def slow_stream(pause_s: float = 0.2, words: int = 60) -> Reply:
    return Reply(chunks=sse(*[delta(f"w{i} ") for i in range(words)], delta("end", "stop")), pause_s=pause_s)


def wait_for_log(gw, text: str, seconds: float = 5.0) -> None:
    """Until a line of the gateway's log holds ``text`` (it logs a request once it has ended)."""
    deadline = time.monotonic() + seconds
    while not any(text in line for line in gw.logs) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_client_that_goes_away_mid_stream_cancels_the_upstream_request():
    fake = FakeServer()
    fake.chat(slow_stream())
    try:
        with gateway_for(fake.base_url, ready=False) as gw:
            with httpx.stream("POST", gw.url + "/v1/messages", json={**GOOD, "stream": True}, timeout=30) as reply:
                for line in reply.iter_lines():
                    if "w2" in line:
                        break  # the client leaves here
            assert fake.cut_short.wait(5.0), "the upstream request went on after the client left"
            wait_for_log(gw, "the client went away")
            assert any("the request to the server was closed" in line for line in gw.logs), gw.logs
    finally:
        fake.close()


@pytest.mark.parametrize("path, body", [("/v1/messages", GOOD), ("/v1/responses", {"model": "m", "input": "Hi"})])
def test_a_client_that_goes_away_before_a_whole_reply_cancels_the_upstream_request(path, body):
    fake = FakeServer()
    fake.chat(slow_stream())  # 12 s of answer, which the client does not wait for
    try:
        with gateway_for(fake.base_url, ready=False) as gw:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(gw.url + path, json=body, timeout=1.5)
            assert fake.cut_short.wait(6.0), "the upstream request went on after the client left"
            wait_for_log(gw, "the client went away")
            assert any("(a whole reply); the request to the server was closed" in line for line in gw.logs), gw.logs
    finally:
        fake.close()


def test_an_upstream_that_dies_mid_stream_ends_the_stream_with_an_error_event():
    fake = FakeServer()
    fake.chat(Reply(chunks=[f"data: {json.dumps(delta('Hel'))}\n\n".encode()]))  # then the connection closes
    try:
        with gateway_for(fake.base_url, ready=False) as gw:
            body = gw.post("/v1/messages", json={**GOOD, "stream": True}).text
            assert "event: error" in body and "ended before the reply finished" in body
            assert body.rstrip().endswith("}")  # the stream ended, with its error as the last event
            responses = gw.post("/v1/responses", json={"model": "m", "input": "Hi", "stream": True}).text
            assert "response.failed" in responses
            sdk = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
            with pytest.raises(anthropic.APIStatusError):
                with sdk.messages.stream(**GOOD) as stream:
                    stream.get_final_message()
    finally:
        fake.close()


def test_an_upstream_that_is_down_is_a_502_in_each_shape():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    with gateway_for(f"http://127.0.0.1:{port}/v1", ready=False) as gw:
        for stream in (False, True):
            refused = gw.post("/v1/messages", json={**GOOD, "stream": stream})
            assert refused.status_code == 502 and refused.json()["error"]["type"] == "api_error"
            assert "cannot connect" in refused.json()["error"]["message"]
        down = gw.post("/v1/responses", json={"model": "m", "input": "Hi"})
        assert down.status_code == 502 and "cannot connect" in down.json()["error"]["message"]
        passed = httpx.get(gw.url + "/health")
        assert passed.status_code == 502 and passed.json()["error"]["type"] == "api_error"
        assert httpx.get(gw.url + "/v1/models").status_code == 200  # (the gateway's own list)


def test_a_long_prefill_is_kept_alive_with_pings():
    fake = FakeServer()
    fake.chat(Reply(chunks=sse(delta("OK", "stop")), pause_s=1.2))
    try:
        with gateway_for(fake.base_url, ready=False, idle_s=0.3) as gw:
            body = gw.post("/v1/messages", json={**GOOD, "stream": True}).text
            assert body.index("event: ping") < body.index("text_delta") and "message_stop" in body
            responses = gw.post("/v1/responses", json={"model": "m", "input": "Hi", "stream": True}).text
            assert ": ping" in responses and "response.completed" in responses
    finally:
        fake.close()


def test_a_system_message_among_messages_is_user_text_where_it_stands_as_claude_code_sends_it(server, claude, gateway):
    reminder = "Answer briefly."
    sent = [CONVERSATION[0], CONVERSATION[1], {"role": "system", "content": reminder}, CONVERSATION[2]]
    reply = claude.messages.create(model="m", max_tokens=32, messages=sent)
    joined = [CONVERSATION[0], CONVERSATION[1], {"role": "user", "content": f"{reminder}\n\n{RECALL}"}]
    assert reply.content[0].text == chat_completion(server, joined)["choices"][0]["message"]["content"]
    assert httpx.head(gateway.url + "/").status_code == 200  # Claude Code checks that something answers
