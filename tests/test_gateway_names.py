"""One name on every endpoint of the gateway's port: the model its banner shows works for chat
completions as for Messages and Responses, both SDKs list model ids (never a path), and stored
responses can be read back and deleted, as the Responses API has them."""

from __future__ import annotations

import anthropic
import openai
import pytest

from fakeserver import FakeServer, Reply
from gateways import gateway_for
from servers import serving


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with serving("demo", tmp_path_factory.mktemp("demo")) as server:
        with gateway_for(server.base_url, "demo") as running:
            yield running


@pytest.fixture(scope="module")
def oai(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def claude(gateway):
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


def test_the_readiness_probes_are_not_logged_as_traffic(gateway):
    assert gateway.logs == []  # (the first test of the module: no client has asked anything yet)


@pytest.mark.parametrize("name", ["demo", "claude-sonnet-4-5", "gpt-5"])
def test_chat_completions_take_the_name_the_banner_shows_and_any_other(oai, name):
    reply = oai.chat.completions.create(model=name, max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
    assert reply.choices[0].message.content


def test_both_sdks_list_model_ids_with_their_own_fields(oai, claude):
    assert [m.id for m in oai.models.list()] == ["demo"]
    listed = list(claude.models.list())
    assert [(m.id, m.type, m.display_name) for m in listed] == [("demo", "model", "demo")]
    assert oai.models.retrieve("demo").id == "demo" and claude.models.retrieve("demo").display_name == "demo"
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")


def test_a_stored_response_is_read_back_and_deleted(oai):
    created = oai.responses.create(model="demo", input="Hello", max_output_tokens=8)
    assert created.usage.input_tokens_details.cache_write_tokens == 0  # the SDK's strict model takes the reply
    again = oai.responses.retrieve(created.id)
    assert again.id == created.id and again.output_text == created.output_text and again.status == "completed"
    oai.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.delete(created.id)
    unstored = oai.responses.create(model="demo", input="Hello", max_output_tokens=8, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)


def test_in_front_of_a_server_it_was_not_told_about_the_list_holds_the_server_s_ids_not_paths():
    fake = FakeServer()
    fake.replies["/v1/models"] = Reply(chunks=[b'{"object": "list", "data": [{"id": "/Users/me/models/qwen"}, '
                                              b'{"id": "qwen3-8b"}]}'], headers={"Content-Type": "application/json"})
    try:
        with gateway_for(fake.base_url, ready=False, served=frozenset({"/Users/me/models/qwen", "qwen3-8b"}),
                         named=False) as gw:
            assert [m["id"] for m in gw.get("/v1/models").json()["data"]] == ["qwen3-8b"]
    finally:
        fake.close()


def test_a_prompt_past_the_model_s_window_is_a_400_in_each_api_s_shape(gateway):
    long = "harbor " * 1600  # ~1,600 tokens: the demo's window is 1,024
    messages = gateway.post("/v1/messages", json={"model": "demo", "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": long}]})
    responses = gateway.post("/v1/responses", json={"model": "demo", "input": long, "max_output_tokens": 8})
    assert messages.status_code == 400 and messages.json()["error"]["type"] == "invalid_request_error"
    assert "over demo's context window of 1,024" in messages.json()["error"]["message"]
    assert responses.status_code == 400 and "context window" in responses.json()["error"]["message"]


def test_a_stored_streamed_response_closes_its_items_and_is_kept_as_streamed(oai):
    events = list(oai.responses.create(model="demo", input="Hello", max_output_tokens=8, stream=True))  # store: default
    kinds = [e.type for e in events]
    assert {"response.output_text.done", "response.content_part.done", "response.output_item.done"} <= set(kinds)
    completed = events[-1].response
    assert kinds[-1] == "response.completed" and oai.responses.retrieve(completed.id).output_text == \
        completed.output_text
