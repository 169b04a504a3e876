"""The one SSE decoder."""

import pytest

from localchat.backends.sse import StreamError, iter_chunks, iter_event_data


def test_comments_keepalives_and_unknown_fields_are_ignored():
    lines = [": keepalive 10/200", "", "event: message", "id: 7", "retry: 10", "data: {\"a\": 1}", "",
             "garbage line", "", "data: [DONE]", "", "data: {\"after\": 1}", ""]
    assert list(iter_chunks(lines)) == [{"a": 1}]


def test_multiline_data_is_joined_and_one_space_stripped():
    assert list(iter_event_data(["data: first", "data:  second", "data:third", ""])) == ["first\n second\nthird"]


def test_last_event_without_blank_line_is_dispatched():
    assert list(iter_event_data(["data: x"])) == ["x"]


def test_error_payload_raises_with_its_message():
    with pytest.raises(StreamError, match="model exploded"):
        list(iter_chunks(['data: {"error": {"message": "model exploded", "code": 500}}', ""]))


def test_non_json_data_raises():
    with pytest.raises(StreamError, match="not JSON"):
        list(iter_chunks(["data: <html>oops</html>", ""]))
