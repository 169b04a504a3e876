"""The one SSE decoder and chunk parser: typed events, or a StreamError naming the field."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localchat.backends.sse import ChatChunk, KeepAlive, StreamError, Usage, iter_event_data, iter_stream, parse_chunk
from localchat.errors import LocalchatError


def chunk(content=None, finish=None, **extra):
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}], **extra}


def test_comments_become_keepalives_and_unknown_fields_are_ignored():
    lines = [": keepalive 10/200", "", "event: message", "id: 7", "retry: 10", f"data: {json.dumps(chunk('a'))}",
             "", "garbage line", "", ": hello", "data: [DONE]", "", f"data: {json.dumps(chunk('b'))}", ""]
    assert list(iter_stream(lines)) == [KeepAlive(10, 200), ChatChunk(content="a"), KeepAlive()]


def test_multiline_data_is_joined_and_one_space_stripped():
    assert list(iter_event_data(["data: first", "data:  second", "data:third", ""])) == ["first\n second\nthird"]


def test_last_event_without_blank_line_is_dispatched():
    assert list(iter_event_data(["data: x"])) == ["x"]


def test_usage_and_cached_tokens_are_read_from_a_chunk_with_no_choices():
    usage = {"prompt_tokens": 20, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 12}}
    assert parse_chunk({"choices": [], "usage": usage}) == ChatChunk(usage=Usage(20, 3, 12))


def test_reasoning_comes_from_either_field():
    delta = {"choices": [{"delta": {"reasoning": "hmm"}}]}
    assert parse_chunk(delta).reasoning == "hmm"
    assert parse_chunk({"choices": [{"delta": {"reasoning_content": "so"}}]}).reasoning == "so"


def test_error_payload_raises_with_its_message():
    with pytest.raises(StreamError, match="model exploded"):
        list(iter_stream(['data: {"error": {"message": "model exploded", "code": 500}}', ""]))


def test_non_json_data_raises():
    with pytest.raises(StreamError, match="not JSON"):
        list(iter_stream(["data: <html>oops</html>", ""]))


@pytest.mark.parametrize("payload, field", [
    ({"choices": [None]}, "choices[0]"),
    ({"choices": "abc"}, "choices"),
    ({"choices": [{"delta": {"content": 5}}]}, "choices[0].delta.content"),
    ({"choices": [{"delta": "text"}]}, "choices[0].delta"),
    ({"choices": [{"delta": {}, "finish_reason": 1}]}, "choices[0].finish_reason"),
    ({"choices": [], "usage": "lots"}, "usage"),
    ({"choices": [], "usage": {"prompt_tokens": -1}}, "usage.prompt_tokens"),
    ({"choices": [], "usage": {"prompt_tokens": 1.5}}, "usage.prompt_tokens"),
    ({"choices": [], "usage": {"completion_tokens": True}}, "usage.completion_tokens"),
    ({"choices": [], "usage": {"prompt_tokens_details": {"cached_tokens": "9"}}},
     "usage.prompt_tokens_details.cached_tokens"),
    ({"choices": [{"delta": {"reasoning": ["x"]}}]}, "choices[0].delta.reasoning"),
])
def test_a_chunk_of_the_wrong_shape_names_its_field(payload, field):
    with pytest.raises(StreamError, match=f"'{field}'".replace("[", r"\[").replace("]", r"\]")):
        parse_chunk(payload)


@pytest.mark.parametrize("payload", [[1, 2], "text", 3, None, True])
def test_a_payload_that_is_not_an_object_is_named(payload):
    with pytest.raises(StreamError, match="unexpected payload"):
        parse_chunk(payload)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
CHUNKISH = st.fixed_dictionaries({}, optional={
    "choices": st.lists(st.one_of(JSON, st.fixed_dictionaries({}, optional={
        "delta": st.one_of(JSON, st.fixed_dictionaries({}, optional={"content": JSON, "reasoning": JSON})),
        "finish_reason": JSON})), max_size=2),
    "usage": st.one_of(JSON, st.fixed_dictionaries({}, optional={
        "prompt_tokens": JSON, "completion_tokens": JSON, "prompt_tokens_details": JSON})),
    "error": JSON})


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, CHUNKISH))
def test_any_json_payload_gives_a_typed_chunk_or_a_stream_error(payload):
    try:
        parsed = parse_chunk(payload)
    except LocalchatError:
        return
    assert isinstance(parsed, ChatChunk)
    assert isinstance(parsed.content, str) and isinstance(parsed.reasoning, str)
    assert parsed.finish_reason is None or isinstance(parsed.finish_reason, str)
    assert parsed.usage is None or all(isinstance(n, int) and n >= 0 for n in vars(parsed.usage).values())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_give_typed_events_or_a_stream_error(data):
    lines = data.decode("utf-8", "replace").split("\n")
    try:
        events = list(iter_stream(lines))
    except LocalchatError:
        return
    assert all(isinstance(e, (ChatChunk, KeepAlive)) for e in events)


LINES = st.lists(st.one_of(
    st.text(max_size=30), st.just(""), st.just("data: [DONE]"),
    st.builds(lambda n, m: f": keepalive {n}/{m}", st.integers(-5, 99), st.integers(0, 99)),
    st.builds(lambda p: "data: " + json.dumps(p), st.one_of(JSON, CHUNKISH))), max_size=12)


@settings(max_examples=300, deadline=None)
@given(LINES)
def test_any_stream_of_lines_gives_typed_events_or_a_stream_error(lines):
    try:
        events = list(iter_stream(lines))
    except LocalchatError:
        return
    assert all(isinstance(e, (ChatChunk, KeepAlive)) for e in events)
