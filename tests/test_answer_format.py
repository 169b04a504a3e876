"""JSON answer mode on the real demo model: valid replies are kept and pretty-printed, invalid
ones are shown with the reason and never enter history."""

import json
import time

import pytest
from typer.testing import CliRunner

from localchat.backends import GenerationParams
from localchat.cli.app import app
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.grammar.answer_formats import (
    AnswerFormat,
    default_schema,
    load_schema,
    with_instruction,
)

runner = CliRunner()
REMEMBER = "Remember the code harbor 17. Reply only OK."
RECALL = "What was the code? Reply with the code only."


def json_session(backend, schema: AnswerFormat) -> ChatSession:
    return ChatSession(backend, Conversation(with_instruction("You are a helpful assistant.", schema)),
                       GenerationParams(max_tokens=32), schema=schema)


@pytest.mark.parametrize("text, ok", [
    ('{"answer": "harbor 17"}', True),
    ('```json\n{"answer": "harbor 17"}\n```', True),
    ('{"answer": 17}', False),
    ('{"answer": "x", "extra": 1}', False),
    ("harbor 17", False),
])
def test_default_schema_checks_replies(text, ok):
    value, error = default_schema().check(text)
    assert (error is None) == ok, error
    assert (value == {"answer": "harbor 17"}) == (ok and "harbor" in text)


def test_valid_reply_is_committed_with_its_parsed_value(demo_backend):
    chat = json_session(demo_backend, default_schema())
    result = chat.ask(REMEMBER)  # which answer is the model's business (test_recall_… checks it)
    assert result.invalid is None and result.answer == json.loads(result.text)
    assert set(result.answer) == {"answer"} and isinstance(result.answer["answer"], str)
    assert result.committed and chat.conversation.turns[0].assistant == result.text


def test_reply_failing_the_schema_is_not_committed(demo_backend, tmp_path):
    schema_file = tmp_path / "code.json"
    schema_file.write_text(json.dumps({"type": "object", "required": ["code"],
                                       "properties": {"code": {"type": "string"}}}))
    schema = load_schema(schema_file)
    chat = json_session(demo_backend, schema)
    chat.conversation.system = with_instruction("You are a helpful assistant.", default_schema())
    result = chat.ask(REMEMBER)  # the demo answers {"answer": "OK"}: JSON, but no "code"
    assert result.stats.finish_reason == "stop"
    assert result.invalid is not None and "'code' is a required property" in result.invalid
    assert not result.committed and chat.conversation.turns == []


def test_reply_that_is_not_json_is_not_committed(demo_backend):
    chat = json_session(demo_backend, default_schema())
    chat.conversation.system = "You are a helpful assistant."  # no instruction: the demo answers "OK"
    result = chat.ask(REMEMBER)
    assert result.text == "OK" and result.invalid.startswith("not JSON")
    assert chat.conversation.turns == []


def test_single_prompt_json_pipes_only_json():
    result = runner.invoke(app, ["chat", "--json", REMEMBER])
    assert result.exit_code == 0, result.stderr
    answer = json.loads(result.stdout)  # stdout holds the JSON and nothing else
    assert set(answer) == {"answer"} and isinstance(answer["answer"], str)
    assert "[TTFT" in result.stderr


def test_a_model_that_would_write_the_wrong_json_writes_valid_json_under_the_mask(tmp_path):
    """The demo was trained to answer {"answer": ...}; asked for {"n": integer} with that instruction,
    its unconstrained reply is invalid (see ``--backend server`` below), and under the mask it validates."""
    schema_file = tmp_path / "n.json"
    schema_file.write_text('{"type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "maximum": '
                           '99, '
                           '"minimum": 0}}, "additionalProperties": false}')  # bounded: the answer ends in time
    result = runner.invoke(
        app, ["chat", "--json-schema", str(schema_file), "--system", 'Answer in JSON: {"answer": "..."}', REMEMBER]
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"n": 17}  # the demo's copy circuit, inside the grammar


def test_a_server_that_ignores_the_format_exits_1_and_the_figures_say_it_once(tmp_path):
    from fakeserver import FakeServer, Reply, delta, sse

    schema_file = tmp_path / "n.json"
    schema_file.write_text('{"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}')
    server = FakeServer()
    server.chat(Reply(chunks=sse(delta('{"answer": "OK"}', "stop"))))
    try:
        result = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--json-schema",
                                     str(schema_file)], input=f"{REMEMBER}\n{REMEMBER}\n/quit\n")
    finally:
        server.close()
    assert result.stdout.count("{") == 0
    assert result.stderr.count("invalid JSON reply, not added to history") == 2
    assert result.stderr.count("the server did not enforce the JSON Schema n (response_format was sent)") == 1
    sent = next(json.loads(body) for path, _, body in server.requests if path.endswith("completions"))
    assert sent["response_format"]["json_schema"]["schema"]["required"] == ["n"]


BACKTRACKS = "^(a|aa)+$"  # Python's re takes hours over forty a's and a "!"; regex's timeout stops it


@pytest.mark.parametrize("fmt, reply", [
    (AnswerFormat("", pattern=BACKTRACKS), "a" * 40 + "!"),
    (AnswerFormat("", {"type": "object", "properties": {"code": {"type": "string", "pattern": BACKTRACKS}}}),
     json.dumps({"code": "a" * 40 + "!"})),
    (AnswerFormat("", {"type": "object", "patternProperties": {BACKTRACKS: {"type": "integer"}}}),
     json.dumps({"a" * 40 + "!": 1})),
    (AnswerFormat("", {"type": "object", "properties": {}, "patternProperties": {BACKTRACKS: {}},
                       "additionalProperties": False}), json.dumps({"a" * 40 + "!": 1})),
])
def test_a_reply_is_checked_against_a_backtracking_pattern_in_seconds(fmt, reply):
    started = time.monotonic()
    value, why = fmt.check(reply)
    assert time.monotonic() - started < 60 and value is None  # not hours (re's); 2 s alone, more on a busy machine
    assert why.startswith("testing it against") and "took over 2 s (a pattern that backtracks)" in why, why


@pytest.mark.parametrize("schema, good, bad, why", [
    ({"type": "object", "properties": {"n": {"type": "integer"}}, "patternProperties": {"^x-": {"type": "string"}},
      "additionalProperties": False}, {"n": 1, "x-a": "s"}, {"n": 1, "y": 2},
     "additional properties are not allowed: 'y'"),
    ({"type": "object", "patternProperties": {"^x-": {"type": "string"}}}, {"x-a": "s", "y": 2}, {"x-a": 3},
     "x-a: 3 is not of type 'string'"),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, {"a": 1}, {"a": "s"}, "a: 's' is not of type"),
    ({"type": "string", "pattern": "^[a-z]+$"}, "abc", "ab1", "does not match"),
])
def test_the_pattern_keywords_keep_their_meaning(schema, good, bad, why):
    fmt = AnswerFormat("", schema)
    assert fmt.check(json.dumps(good)) == (good, None)
    value, reason = fmt.check(json.dumps(bad))
    assert value is None and why in reason, reason


def test_a_server_reply_against_a_backtracking_regex_is_refused_in_one_line(tmp_path):
    from fakeserver import FakeServer, Reply, delta, sse

    server = FakeServer()
    server.chat(Reply(chunks=sse(delta("a" * 40 + "!", "stop"))))
    started = time.monotonic()
    try:
        result = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--no-log",
                                     "--regex", BACKTRACKS, "Hi"])
    finally:
        server.close()
    assert result.exit_code == 1 and time.monotonic() - started < 30, result.stderr
    assert "took over 2 s (a pattern that backtracks)" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("content, needle", [
    ("{not json", "is not valid JSON"),
    ('{"type": "nonsense"}', "is not a valid JSON Schema"),
    ("[1, 2]", "must hold a JSON object"),
])
def test_bad_schema_file_is_a_usage_error(tmp_path, content, needle):
    schema_file = tmp_path / "s.json"
    schema_file.write_text(content)
    result = runner.invoke(app, ["chat", "--json-schema", str(schema_file), "hi"])
    assert result.exit_code == 2 and needle in result.stderr
    assert "Traceback" not in result.stderr


def test_json_and_json_schema_together_is_a_usage_error(tmp_path):
    schema_file = tmp_path / "s.json"
    schema_file.write_text('{"type": "object"}')
    result = runner.invoke(app, ["chat", "--json", "--json-schema", str(schema_file), "hi"])
    assert result.exit_code == 2 and "alternatives" in result.stderr


def test_recall_with_history_in_json_mode(demo_backend):
    chat = json_session(demo_backend, default_schema())
    assert chat.ask(REMEMBER).answer == {"answer": "OK"}
    assert chat.ask("Hello").committed
    recall = chat.ask(RECALL)
    assert recall.answer == {"answer": "harbor 17"} and recall.committed


def test_a_formatted_reply_cut_over_http_is_a_failure_that_says_so(tmp_path, monkeypatch):
    from fakeserver import FakeServer, Reply, delta, sse

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    fake = FakeServer()
    fake.chat(Reply(chunks=sse(delta('{"answer": "a lo'), delta("ng", "length"))))
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", fake.base_url, "--json",
                                   "--max-tokens", "4", "Hi"])
    finally:
        fake.close()
    assert done.exit_code == 1 and done.stdout == "", done.stdout
    assert "no valid answer in the format asked for" in done.stderr and "raise --max-tokens" in done.stderr
