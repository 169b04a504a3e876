"""Hostile requests to ``localchat serve`` (the front and its enforcing engine, on demo-tools):
each a 400 in OpenAI's shape naming its field, before anything is generated; the server's own
path for its model never shown; a client that hangs up stops its reply being generated."""

import json
import socket
import time

import httpx
import pytest

from localchat.registry import resolve
from routed import Serve

TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}}, "required": ["a"]}}}


def deep(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def tool(parameters) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


CYCLE = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
HOSTILE = [
    ({"guided_regex": "a{1000000000}"}, "guided_regex"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "integer", "minimum": 9223372036854775808}}}}, "response_format"),
    ({"guided_regex": "((a{100}){100}){100}"}, "guided_regex"),
    ({"tools": 5}, "tools"),
    ({"tools": "add"}, "tools"),
    ({"tools": [5]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools"),
    ({"tools": tool(deep(200)), "tool_choice": "required"}, "tools"),
    ({"tools": tool(deep(200))}, "tools"),
    ({"tools": tool(CYCLE), "tool_choice": "required"}, "tools"),
    ({"tools": tool({"$ref": "#"}), "tool_choice": "required"}, "tools"),
    ({"tools": tool({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]}),
      "tool_choice": "required"}, "tools"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": deep(100)}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "minimum": -(2**70)}}}}, "response_format"),
    ({"guided_choice": ["yes\x00", "no"]}, "guided_choice"),
    ({"guided_choice": ["yes\nno", "no"]}, "guided_choice"),
    ({"guided_choice": [" yes", "no"]}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "stop": ["}"]}, "stop"),
    ({"tools": [TOOL], "tool_choice": "required", "stop": "<"}, "stop"),
]


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    server = Serve(tmp_path_factory.mktemp("home"), "-m", "demo-tools")
    yield server
    server.stop()


@pytest.mark.parametrize("fields, param", HOSTILE, ids=[f"{i}-{p}" for i, (_, p) in enumerate(HOSTILE)])
def test_a_hostile_request_is_a_400_naming_its_field(serve, fields, param):
    reply = serve.ask("demo-tools", **fields)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert len(error["message"].splitlines()) == 1
    assert serve.ask("demo-tools").status_code == 200  # and the server is still there


@pytest.mark.parametrize("name", ["../../etc/passwd", "/tmp/anything", "x" * 5000, "", "demo-tools\x00"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_hostile_model_name_never_shows_the_servers_path(serve, name, stream):
    location = resolve("demo-tools").location
    reply = serve.ask(name, stream=stream)
    assert reply.status_code == 200, reply.text
    assert location not in reply.text and json.dumps(location)[1:-1] not in reply.text
    if not stream:
        assert reply.json()["model"] == "demo-tools"


def test_a_client_that_hangs_up_stops_its_reply_being_generated(serve):
    """A whole (not streamed) reply of 100,000 tokens (its end token banned), abandoned: the engine
    stops generating it (its log says so) and the next request is answered."""
    from mlx_lm.utils import load_tokenizer

    from localchat.registry import local_dir

    ends = load_tokenizer(local_dir(resolve("demo-tools"))).eos_token_ids
    body = json.dumps({"model": "demo-tools", "messages": [{"role": "user", "content": "Tell a story."}],
                       "max_tokens": 100_000, "logit_bias": {str(end): -1000 for end in ends}}).encode()
    with socket.create_connection(("127.0.0.1", serve.port)) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % serve.port
                       + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(1.5)
    serve.wait_log("the client hung up first")
    engine_log = next(row["log"] for row in serve.held() if row["model"] == "demo-tools")
    deadline = time.monotonic() + 30
    while "its reply is no longer generated" not in open(engine_log).read() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "its reply is no longer generated" in open(engine_log).read()
    assert httpx.post(serve.url + "/v1/chat/completions", timeout=60, json={
        "model": "demo-tools", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).status_code == 200


def picture(url) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.mark.parametrize("messages", [
    picture("http://127.0.0.1:22/"), picture("http://localhost:8080/admin"), picture("file:///etc/passwd"),
    picture("/etc/passwd"), picture("~/.ssh/id_rsa"), picture(["data:image/png;base64,AAAA"]),
    [{"role": "user", "content": [{"type": "input_image", "image_url": "/etc/hosts"}]}],
    [{"role": "user", "content": [{"type": "image", "image": "http://169.254.169.254/latest"}]}],
    [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "/tmp/a.mp4"}}]}],
    [{"role": "system", "content": "x"}, {"role": "user", "content": [{"type": "input_image", "file_id": "/x"}]}],
])
def test_a_picture_named_by_url_or_path_is_refused_not_fetched(serve, messages):
    reply = httpx.post(serve.url + "/v1/chat/completions", timeout=60,
                       json={"model": "demo-tools", "messages": messages, "max_tokens": 4})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"].startswith("messages[") and "fetches no URL and opens no file" in error["message"]


def test_allowed_url_prefixes_and_data_urls_pass_the_check():
    from localchat.serve.apis.chat_completions.passthrough import check_media
    from localchat.serve.request import ApiError

    body = {"messages": picture("https://example.com/img/a.png")}
    check_media(body, ("https://example.com/img/",))
    check_media({"messages": picture("data:image/png;base64,AAAA")}, ())
    with pytest.raises(ApiError):
        check_media(body, ("https://example.com/other/",))


@pytest.mark.parametrize("stream", [False, True])
def test_the_engine_names_its_model_by_the_served_id_so_the_front_relays_bytes_as_they_are(serve, stream):
    """Asked directly, the engine child already writes ``demo-tools`` where mlx_lm writes its path:
    the front has nothing to rewrite, and what a client gets through it names the same id."""
    engine = next(row["engine_url"] for row in serve.held() if row["model"] == "demo-tools")
    body = {"model": resolve("demo-tools").location, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, "stream": stream, "stream_options": {"include_usage": True}}
    direct = httpx.post(engine + "/chat/completions", json=body, timeout=60)
    through = serve.ask("demo-tools", max_tokens=4, stream=stream, stream_options={"include_usage": True})
    for reply in (direct, through):
        assert reply.status_code == 200 and '"model": "demo-tools"' in reply.text, reply.text
        assert resolve("demo-tools").location not in reply.text


FRONT_REFUSALS = [
    (b'{"model": "demo-tools", "messages": [', None),
    (b'{"model": null, "messages": []}', "model"),
    (b'{"model": 5, "messages": []}', "model"),
    (b'{"model": ["a"], "messages": []}', "model"),
    (b'{"model": "demo-tools", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}", None),
    (b'{"model": "demo-tools", "messages": [], "top_p": 2}', "top_p"),
    (b'{"model": "demo-tools", "messages": [], "temperature": "hot"}', "temperature"),
    (b'{"model": "demo-tools", "messages": [], "temperature": NaN}', None),
    (b'{"model": "demo-tools", "messages": [], "max_tokens": -1}', "max_tokens"),
    (b'{"model": "demo-tools", "messages": [], "stream": "yes"}', "stream"),
    (b'{"model": "demo-tools", "messages": "hi"}', "messages"),
    (b"[1, 2]", None),
]


@pytest.mark.parametrize("body, param", FRONT_REFUSALS, ids=[f"refusal-{i}" for i in range(len(FRONT_REFUSALS))])
def test_the_front_refuses_a_malformed_chat_completion_in_openais_shape(serve, body, param):
    reply = httpx.post(serve.url + "/v1/chat/completions", content=body, timeout=60,
                       headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and "\n" not in error["message"]
    assert serve.ask("demo-tools").status_code == 200  # and the engine is still there


def test_completions_are_relayed_and_a_request_without_a_model_names_the_served_one(serve):
    text = httpx.post(serve.url + "/v1/completions", timeout=60,
                      json={"model": "demo-tools", "prompt": "Hello", "max_tokens": 4})
    assert text.status_code == 200 and text.json()["model"] == "demo-tools", text.text
    nameless = httpx.post(serve.url + "/v1/chat/completions", timeout=60,
                          json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert nameless.status_code == 200 and nameless.json()["model"] == "demo-tools", nameless.text


def test_a_prompt_past_the_models_window_is_refused_with_the_counts(serve):
    long_text = "harbor boat wind " * 4000
    reply = httpx.post(serve.url + "/v1/chat/completions", timeout=120, json={
        "model": "demo-tools", "messages": [{"role": "user", "content": long_text}], "max_tokens": 4})
    assert reply.status_code == 400, reply.text[:300]
    error = reply.json()["error"]
    assert error["param"] == "messages" and "tokens, over demo-tools's context window of" in error["message"]
    assert serve.ask("demo-tools").status_code == 200
