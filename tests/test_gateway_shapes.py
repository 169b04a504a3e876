"""What the gateway gives clients is always valid for their SDKs: a call's arguments are a JSON
object (never NaN or broken text), echoed fields are of their types, a reasoning item's content
is checked, and an upstream that does not answer a count is a 504 saying which server."""

from __future__ import annotations

import json

import pytest

from fakeserver import FakeServer, Reply, delta, sse
from gateways import gateway_for

ADD = {"type": "object", "properties": {"a": {"type": "integer"}}}


def call_reply(arguments: str) -> Reply:
    call = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "x", "function": {
        "name": "add", "arguments": arguments}}]}, "finish_reason": "tool_calls"}]}
    return Reply(chunks=sse(call))


@pytest.mark.parametrize("arguments", ['{"a": NaN}', '{"a": 1', "[1, 2]", ""])
def test_a_call_whose_arguments_are_not_a_json_object_reaches_clients_as_an_object(arguments):
    fake = FakeServer()
    fake.chat(call_reply(arguments))
    try:
        with gateway_for(fake.base_url, ready=False) as gw:
            messages = gw.post("/v1/messages", json={"model": "m", "max_tokens": 16, "tools": [
                {"name": "add", "input_schema": ADD}], "messages": [{"role": "user", "content": "Add."}]})
            responses = gw.post("/v1/responses", json={"model": "m", "input": "Add.", "tools": [
                {"type": "function", "name": "add", "parameters": ADD}]})
    finally:
        fake.close()
    assert messages.status_code == 200 and messages.json()["content"][0]["input"] == {}, messages.text
    assert responses.status_code == 200, responses.text
    call = next(i for i in responses.json()["output"] if i["type"] == "function_call")
    assert json.loads(call["arguments"]) == {}


@pytest.mark.parametrize("body, needle", [
    ({"store": "no"}, "store: must be"), ({"metadata": 5}, "metadata: must be"),
    ({"metadata": {"k": 1}}, "metadata: at most 16 string values"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls: must be"),
    ({"input": [{"type": "reasoning", "content": 5}, {"role": "user", "content": "Hi"}]}, "input.0.content: must be"),
])
def test_fields_of_the_wrong_type_are_a_400_in_openai_s_shape(body, needle):
    with gateway_for("http://127.0.0.1:9/v1", ready=False) as gw:
        refused = gw.post("/v1/responses", json={"model": "m", "input": "Hi", **body})
    assert refused.status_code == 400 and needle in refused.json()["error"]["message"], refused.text


def test_an_upstream_that_does_not_answer_a_count_is_a_504_naming_it():
    fake = FakeServer()
    fake.chat(Reply(chunks=sse(delta("x", "stop")), pause_s=5))
    try:
        with gateway_for(fake.base_url, ready=False, timeout_s=1.0) as gw:
            counted = gw.post("/v1/messages/count_tokens", json={"model": "m", "messages": [
                {"role": "user", "content": "Hi"}]})
    finally:
        fake.close()
    assert counted.status_code == 504, counted.text
    error = counted.json()["error"]
    assert error["type"] == "api_error" and fake.base_url in error["message"] and "did not answer" in error["message"]


def test_a_client_that_goes_away_during_a_count_closes_the_count_upstream():
    import httpx

    fake = FakeServer()
    fake.chat(Reply(chunks=sse(*[delta(f"w{i}") for i in range(40)], delta("x", "stop")), pause_s=0.3))
    try:
        with gateway_for(fake.base_url, ready=False) as gw:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(gw.url + "/v1/messages/count_tokens", timeout=1.0, json={
                    "model": "m", "messages": [{"role": "user", "content": "Hi"}]})
            assert fake.cut_short.wait(4.0), "the count upstream went on after the client left"
    finally:
        fake.close()


def test_an_upstream_that_echoes_its_key_never_shows_it_to_the_gateway_s_clients():
    key = "sk-upstream-" + "4" * 24
    fake = FakeServer()
    echo = Reply(500, [b'{"error": "boom"} '], {"Content-Type": "application/json"}, echo_headers=True)
    fake.chat(echo)
    fake.replies["/v1/models"] = echo
    try:
        with gateway_for(fake.base_url, ready=False) as gw:
            gw.upstream.api_key = key  # the server's own key, which the gateway sends upstream
            passed = gw.post("/v1/chat/completions", json={"model": "m",
                                                           "messages": [{"role": "user", "content": "x"}]})
            messages = gw.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": [
                {"role": "user", "content": "x"}]})
            listed = gw.get("/v1/models")
    finally:
        fake.close()
    assert fake.requests and all(key in {k.lower(): v for k, v in headers.items()}.get("authorization", "")
                                 for _, headers, _ in fake.requests)
    for answer in (passed, messages, listed):
        assert key not in answer.text, answer.text
    assert passed.status_code == 500 and "[api key]" in passed.text


@pytest.mark.parametrize("listing", [b"[1, 2]", b"7", b'{"data": 5}', b"not json"])
def test_a_gateway_starts_in_front_of_a_server_whose_model_list_is_anything(listing):
    from localchat.serve.pool.upstream import reach_upstream

    fake = FakeServer()
    fake.replies["/v1/models"] = Reply(chunks=[listing], headers={"Content-Type": "application/json"})
    try:
        upstream = reach_upstream(fake.base_url, None)
    finally:
        fake.close()
    assert upstream.served == frozenset()
