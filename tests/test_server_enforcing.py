"""``localchat serve`` enforces what clients ask: mlx_lm.server's own engine with the grammar mask
added per request (``serve.engine.enforcing``), through the openai SDK, on SmolLM2 and demo-tools."""

import inspect
import json
import threading

import jsonschema
import openai
import pytest

from localchat.serve.engine import seam
from localchat.serve.engine.enforcing import ENFORCED_HEADER
from servers import openai_client, serving

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "role": {"enum": ["engineer", "poet", "pilot"]},
                                           "home": {"type": "object", "properties": {"city": {"type": "string",
                                                                                              "maxLength": 16}},
                                                    "required": ["city"], "additionalProperties": False}},
          "required": ["name", "role", "home"], "additionalProperties": False}
PROMPTS = ["Describe Ada Lovelace.", "Tell me about a pilot from Paris.", "Who are you?"]


@pytest.fixture(scope="module")
def smol_server(smollm2, tmp_path_factory):
    with serving(smollm2, tmp_path_factory.mktemp("smol")) as server:
        yield server


@pytest.fixture(scope="module")
def smol(smol_server):
    return openai_client(smol_server.base_url)


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory):
    with serving("demo-tools", tmp_path_factory.mktemp("tools")) as server:
        yield openai_client(server.base_url)


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    with serving("demo", tmp_path_factory.mktemp("plain-demo")) as server:
        yield openai_client(server.base_url)


def ask(client, content, **fields):
    raw = client.chat.completions.with_raw_response.create(
        model="default_model", messages=[{"role": "user", "content": content}], temperature=0, **fields)
    return raw.headers.get(ENFORCED_HEADER), raw.parse().choices[0]


def test_a_json_schema_reply_is_valid(smol):
    """(SmolLM2 decodes at ~7 tok/s here: one prompt; the chat below and four formats at once ask
    for the same schema, and the grammar's own tests hold every kind of format and hostile schema.)"""
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    enforced, choice = ask(smol, PROMPTS[1], response_format=fmt, max_tokens=120)
    assert enforced == "json_schema"
    jsonschema.validate(json.loads(choice.message.content), PERSON)  # required fields, the enum, the nesting


def test_json_object_regex_and_choice(smol):
    enforced, choice = ask(smol, "Say hello.", response_format={"type": "json_object"}, max_tokens=60)
    assert enforced == "json_object" and isinstance(json.loads(choice.message.content), dict)
    enforced, choice = ask(smol, "Pick a number.", max_tokens=10, extra_body={"guided_regex": "[0-9]{3}"})
    assert enforced == "regex" and len(choice.message.content) == 3 and choice.message.content.isdigit()
    enforced, choice = ask(smol, "Is the sky green?", max_tokens=10, extra_body={"guided_choice": ["yes", "no"]})
    assert enforced == "choice" and choice.message.content in ("yes", "no")


def test_a_format_the_grammar_cannot_compile_is_a_400_before_anything_is_generated(smol):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": {"a": {"$ref": "#/nope"}}}}}
    with pytest.raises(openai.BadRequestError) as refused:
        ask(smol, "hi", response_format=bad)
    error = refused.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == "response_format"
    assert "cannot be enforced" in error["message"]
    with pytest.raises(openai.BadRequestError, match="guided_choice"):
        ask(smol, "hi", extra_body={"guided_choice": ["only one"]})


def test_a_request_without_a_format_is_plain_mlx_lm_servers_greedy_answer(smol, smollm2, tmp_path):
    """Parity: the same greedy request to the unmodified server (``serve --plain``) gives the same text."""
    from localchat.server.launch import free_port, launch, wait_ready

    plain = launch(str(smollm2), port=free_port(), log_path=tmp_path / "plain.log", plain=True)
    try:
        wait_ready(plain, timeout_s=120)
        client = openai_client(plain.base_url)
        # (SmolLM2 decodes at ~7 tok/s here: 16 tokens of one prompt tell two greedy decodes apart)
        enforced, ours = ask(smol, PROMPTS[0], max_tokens=16)
        header, theirs = ask(client, PROMPTS[0], max_tokens=16)
        assert enforced is None and header is None
        assert ours.message.content == theirs.message.content and ours.finish_reason == theirs.finish_reason
    finally:
        plain.stop()


def test_four_concurrent_requests_with_four_formats_are_batched_and_all_valid(smol):
    """Four formats at once: every reply valid, and the engine decoded them together (each streamed
    reply's tokens kept arriving while the others' did: one at a time, each would start after the
    one before it ended)."""
    import time

    def word(text):
        assert text.isalpha() and text[0].isupper() and 3 <= len(text) <= 9, text

    def colour(text):
        assert text in ("red", "green", "blue"), text

    formats = [({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}},
                lambda t: jsonschema.validate(json.loads(t), PERSON)),
               ({"response_format": {"type": "json_object"}}, lambda t: json.loads(t).keys()),
               ({"extra_body": {"guided_regex": "[A-Z][a-z]{2,8}"}}, word),
               ({"extra_body": {"guided_choice": ["red", "green", "blue"]}}, colour)]
    results: dict[int, str] = {}
    spans: dict[int, tuple[float, float]] = {}
    start = threading.Barrier(4)

    def one(i):
        start.wait()
        stream = smol.chat.completions.create(model="default_model", temperature=0, max_tokens=120, stream=True,
                                              messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                              **formats[i][0])
        text, times = "", []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                times.append(time.monotonic())
        results[i], spans[i] = text, (times[0], times[-1])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(results) == [0, 1, 2, 3]
    for i, (_, valid) in enumerate(formats):
        valid(results[i])
    longest = max(spans, key=lambda i: spans[i][1] - spans[i][0])
    overlapping = [
        i for i in spans if i != longest and spans[i][0] < spans[longest][1] and spans[longest][0] < spans[i][1]
    ]
    assert overlapping, spans  # another reply's tokens came while the longest one's were coming


@pytest.mark.parametrize("choice, said", [("required", "tool_choice=required"),
                                          ({"type": "function", "function": {"name": "add"}},
                                           "tool_choice=function:add")])
def test_a_forced_tool_choice_always_calls_add(tools_server, choice, said):
    for prompt in ("Hello there!", "Tell me a story.", "What is 12 plus 30?"):
        enforced, reply = ask(tools_server, prompt, tools=TOOLS, tool_choice=choice, max_tokens=64)
        assert enforced == said  # the header names what was enforced: a named function is not "required"
        assert reply.finish_reason == "tool_calls" and reply.message.tool_calls, reply
        call = reply.message.tool_calls[0]
        assert call.function.name == "add"
        assert set(json.loads(call.function.arguments)) == {"a", "b"}


def test_tool_choice_none_never_starts_a_call(tools_server):
    enforced, reply = ask(tools_server, "What is 12 plus 30?", tools=TOOLS, tool_choice="none", max_tokens=40)
    assert enforced == "tool_choice=none" and not reply.message.tool_calls and reply.finish_reason != "tool_calls"
    assert "<tool_call>" not in (reply.message.content or "")
    auto = ask(tools_server, "What is 12 plus 30?", tools=TOOLS, max_tokens=64)[1]
    assert auto.message.tool_calls  # the toy calls when it may: "none" is what stopped it


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_call_forced_on_a_model_whose_template_takes_no_tools_is_a_400(demo_server, choice):
    with pytest.raises(openai.BadRequestError) as refused:
        ask(demo_server, "What is 12 plus 30?", tools=TOOLS, tool_choice=choice)
    assert refused.value.body["param"] == "tools" and "takes no tools" in refused.value.body["message"]


def test_naming_a_tool_that_was_not_offered_is_a_400(tools_server):
    with pytest.raises(openai.BadRequestError) as refused:
        ask(tools_server, "hi", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "mul"}})
    assert refused.value.body["param"] == "tool_choice"


def test_the_seam_is_where_it_was_in_the_tested_mlx_lm():
    """If an mlx-lm upgrade moves a part the engine uses, this fails and says which (engine/seam.py)."""
    from importlib.metadata import version

    seam.check()  # exits naming the part that moved
    engine = inspect.getsource(__import__("mlx_lm.server", fromlist=["x"]).ResponseGenerator)
    assert engine.count("_make_logits_processors(args)") >= 2 and engine.count("_make_sampler(args") >= 2
    assert version("mlx-lm") == seam.TESTED_MLX_LM or pytest.fail(
        f"mlx-lm {version('mlx-lm')} is not the version the seam was tested with ({seam.TESTED_MLX_LM}): "
        "run this file and scripts/bench_server_formats.py, then change it")


@pytest.fixture(scope="module")
def tools_gateway(tmp_path_factory):
    from gateways import gateway_for

    with serving("demo-tools", tmp_path_factory.mktemp("gw")) as server, gateway_for(server.base_url,
                                                                                      "demo-tools") as gateway:
        yield gateway


def test_the_gateway_forwards_anthropics_forced_tool_choice(tools_gateway):
    import anthropic

    claude = anthropic.Anthropic(base_url=tools_gateway.url, api_key="unused", max_retries=0)
    add = {"name": "add", "description": "Add two integers.", "input_schema": TOOLS[0]["function"]["parameters"]}
    for prompt in ("Hello there!", "Write a haiku."):
        message = claude.messages.create(model="claude-sonnet-4-5", max_tokens=64, tools=[add],
                                         tool_choice={"type": "tool", "name": "add"},
                                         messages=[{"role": "user", "content": prompt}])
        assert message.stop_reason == "tool_use"
        calls = [block for block in message.content if block.type == "tool_use"]
        assert calls and calls[0].name == "add" and set(calls[0].input) == {"a", "b"}


def test_the_gateway_forwards_a_responses_json_schema_format(tools_gateway):
    oai = openai.OpenAI(base_url=tools_gateway.url + "/v1", api_key="unused", max_retries=0)
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 16}}, "required": ["answer"],
              "additionalProperties": False}
    response = oai.responses.create(model="gpt-5", input="What is 2 + 2?", max_output_tokens=48, temperature=0,
                                    text={"format": {"type": "json_schema", "name": "answer", "schema": schema,
                                                     "strict": True}})
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema"


def test_chat_against_a_server_that_enforces_gets_valid_answers_and_no_note(smol_server, tmp_path):
    from typer.testing import CliRunner

    from localchat.cli.app import app

    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    result = CliRunner().invoke(app, ["chat", "--backend", "server", "--base-url", smol_server.base_url, "--no-log",
                                      "--json-schema", str(schema), "--max-tokens", "120", "Describe Ada Lovelace."])
    assert result.exit_code == 0, result.stderr
    jsonschema.validate(json.loads(result.stdout), PERSON)
    assert "did not enforce" not in result.stderr


def test_a_reply_the_grammar_can_take_no_further_ends_with_its_end_token_and_says_why(caplog):
    import mlx.core as mx

    from localchat.grammar.mask import DeadEnd
    from localchat.serve.engine.reply_masks import EndOnDeadEnd

    calls = []

    def stuck(tokens, logits):
        calls.append(1)
        raise DeadEnd("the format allows no next token here: the answer cannot go on")

    guard = EndOnDeadEnd(stuck, eos=(2,))
    with caplog.at_level("WARNING"):
        for _ in range(3):
            out = guard(mx.array([1, 5]), mx.zeros((1, 8)))
            assert mx.argmax(out, axis=-1).item() == 2 and out[0, 3].item() == -float("inf")
    assert len(calls) == 1  # said once, then only the end may follow
    assert "a reply ended early: the format allows no next token" in caplog.text
